package outbox

import (
	"context"
	"errors"
	"fmt"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// Tx is a transaction of one database as [WithTx] drives it: each outbox
// package wraps its driver's transaction and its store in one.
type Tx interface {
	// Executor is what the outbox's publisher writes through.
	Executor() wsql.ContextExecutor
	// Complete completes lease's key inside the transaction, recording
	// output (the store's CompleteTxOutput).
	Complete(ctx context.Context, lease backends.Lease, output []byte) error
	// Commit commits the transaction.
	Commit(ctx context.Context) error
	// Rollback rolls the transaction back; one already ended (by a failed
	// commit, or by the server after a deadlock) is no error.
	Rollback(ctx context.Context) error
}

// WithTx runs fn in a transaction that begin starts, under the lease in
// ctx: fn writes its rows through tx and its messages through pub (the
// outbox table, in tx), then the key is completed in tx with the output
// the lease's door records (middleware.CompletionOutput), and tx commits.
// If anything fails, or fn panics, tx rolls back: nothing of it was
// recorded. Without a lease in ctx it returns ErrNoLease and begins
// nothing.
func WithTx[T Tx](ctx context.Context, o *Outbox, begin func(context.Context) (T, error), fn func(tx T, pub message.Publisher) error) (err error) {
	lease, ok := idempotency.LeaseFromContext(ctx)
	if !ok {
		return ErrNoLease
	}
	tx, err := begin(ctx)
	if err != nil {
		return fmt.Errorf("sqloutbox: begin: %w", err)
	}
	committed := false
	defer func() {
		// Also when fn panics: the transaction would otherwise keep its
		// connection, and its locks, for good.
		if committed {
			return
		}
		if rerr := tx.Rollback(context.WithoutCancel(ctx)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("sqloutbox: rollback: %w", rerr))
		}
	}()
	inner, err := o.Publisher(tx.Executor())
	if err != nil {
		return err
	}
	pub := &wrote{Publisher: inner}
	if err := fn(tx, pub); err != nil {
		return err
	}
	output, err := idempotency.CompletionOutput(ctx)
	if err != nil {
		return fmt.Errorf("sqloutbox: the output to record: %w", err)
	}
	if err := tx.Complete(ctx, lease, output); err != nil {
		return err
	}
	BeforeCommit()
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("sqloutbox: commit: %w", err)
	}
	committed = true
	if pub.any {
		o.Wake()
	}
	// The door need not complete the key again, nor check why it cannot.
	idempotency.MarkCompletedInTx(ctx)
	return nil
}

// wrote is a publisher that remembers whether it wrote anything: a
// transaction that wrote nothing to the outbox wakes no Forwarder.
type wrote struct {
	message.Publisher
	any bool
}

func (w *wrote) Publish(topic string, msgs ...*message.Message) error {
	w.any = w.any || len(msgs) > 0
	return w.Publisher.Publish(topic, msgs...)
}

// Handler is a router handler that runs fn through withTx (the outbox
// package's WithTx) with the message's context: both packages' Handler.
func Handler[T any](withTx func(context.Context, func(T) error) error, fn func(T, *message.Message) error) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		return withTx(msg.Context(), func(tx T) error { return fn(tx, msg) })
	}
}
