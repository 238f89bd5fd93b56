package sqloutbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/internal/outbox"
)

// PgxDB is what a Postgres outbox needs of the database: a *pgxpool.Pool
// satisfies it. It must reach the database of the store's table.
type PgxDB interface {
	wsql.Conn
}

// Postgres runs handlers in a transaction on Postgres that holds their
// own writes, their output messages (in the outbox table) and the
// completion of their idempotency key.
type Postgres struct {
	outbox *outbox.Outbox
	conn   PgxDB
	store  *pgstore.Store
}

// NewPostgres returns the outbox of store on db, which must reach the
// store's database. Call [Postgres.Migrate] once to create its tables.
func NewPostgres(db PgxDB, store *pgstore.Store, opts Options) (*Postgres, error) {
	if db == nil || store == nil {
		return nil, fmt.Errorf("%w: nil database or store", ErrInvalidOptions)
	}
	o, err := outbox.New(wsql.BeginnerFromPgx(db), opts.config(), wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{})
	if err != nil {
		return nil, err
	}
	return &Postgres{outbox: o, conn: db, store: store}, nil
}

// Migrate creates the outbox table and the Forwarder's offsets table if
// they do not exist. The store's own table is created by its Migrate.
func (p *Postgres) Migrate(ctx context.Context) error { return p.outbox.Migrate(ctx) }

// PgxTx is the transaction a handler made by [Postgres.Handler] runs in:
// a pgx.Tx whose Commit and Rollback belong to the outbox, with Publish.
type PgxTx struct {
	pgx.Tx
	pub message.Publisher
}

// Publish writes msgs, bound for topic, into the outbox inside the
// transaction: they reach the broker (through the Forwarder) if and only
// if the transaction commits. Each keeps its UUID and metadata.
func (t *PgxTx) Publish(topic string, msgs ...*message.Message) error {
	return outbox.Publish(t.pub, topic, msgs)
}

// Commit returns ErrOwnedTx: the outbox commits the transaction after the
// handler returns.
func (t *PgxTx) Commit(context.Context) error { return ErrOwnedTx }

// Rollback returns ErrOwnedTx: return an error from the handler instead.
func (t *PgxTx) Rollback(context.Context) error { return ErrOwnedTx }

// PgxHandlerFunc is a handler that writes its effects through tx and
// publishes its output with tx.Publish. It returns no messages: what it
// publishes goes through the outbox.
type PgxHandlerFunc func(tx *PgxTx, msg *message.Message) error

// Handler returns a handler for the router that begins a transaction,
// runs fn in it, completes the message's idempotency key in it (with no
// output to replay: the output is in the outbox), and commits. If fn
// fails, or the key can no longer be completed by this lease, the
// transaction rolls back and the handler fails: nothing of it was
// recorded. The idempotency middleware, with this outbox's store, must
// wrap the handler (router.AddMiddleware or idem.Middleware around it):
// without a lease it fails with ErrNoLease.
func (p *Postgres) Handler(fn PgxHandlerFunc) message.NoPublishHandlerFunc {
	return func(msg *message.Message) (err error) {
		l, err := outbox.Lease(msg)
		if err != nil {
			return err
		}
		ctx := msg.Context()
		tx, err := p.conn.BeginTx(ctx, pgx.TxOptions{})
		if err != nil {
			return fmt.Errorf("sqloutbox: begin: %w", err)
		}
		defer func() {
			if err != nil {
				if rerr := tx.Rollback(context.WithoutCancel(ctx)); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
					err = errors.Join(err, fmt.Errorf("sqloutbox: rollback: %w", rerr))
				}
			}
		}()
		pub, err := p.outbox.Publisher(wsql.TxFromPgx(tx))
		if err != nil {
			return err
		}
		if err := fn(&PgxTx{Tx: tx, pub: pub}, msg); err != nil {
			return err
		}
		if err := p.store.CompleteTx(ctx, tx, l, nil); err != nil {
			return err
		}
		outbox.BeforeCommit()
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("sqloutbox: commit: %w", err)
		}
		return nil
	}
}

// NewForwarder returns the Forwarder that moves the outbox's messages to
// their destination topics through out, the real broker's publisher. Run
// it (Run, or the Router of cfg) in the service, in as many copies as
// wanted: they share the outbox's consumer group, and one forwards at a
// time. Leave cfg's ForwarderTopic and Marshaler unset: the outbox's
// Options set both.
func (p *Postgres) NewForwarder(out message.Publisher, logger watermill.LoggerAdapter, cfg forwarder.Config) (*forwarder.Forwarder, error) {
	return p.outbox.NewForwarder(out, logger, cfg)
}
