package middleware

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

type leaseCtxKey struct{}

// held is what the context of work under a lease carries.
type held struct {
	lease     backends.Lease
	w         work
	completed atomic.Bool // MarkCompletedInTx
}

func heldFrom(ctx context.Context) (*held, bool) {
	h, ok := ctx.Value(leaseCtxKey{}).(*held)
	return h, ok
}

// LeaseFromContext returns the lease the work runs under: inside a
// Watermill handler, call it with msg.Context(); inside a function given
// to [Do], or an HTTP handler behind package httpidem, with the context it
// is given. Pass Lease.Token to the systems the work writes to, so they
// can reject writes from a holder whose lease was taken over (fencing).
func LeaseFromContext(ctx context.Context) (backends.Lease, bool) {
	h, ok := heldFrom(ctx)
	if !ok {
		return backends.Lease{}, false
	}
	return h.lease, true
}

// ErrNoLease is returned by [CompletionOutput] for a context that carries
// no lease: work that runs without the middleware, [Do] or httpidem.
var ErrNoLease = errors.New("idempotency: no lease in the context")

// CompletionOutput returns the output to record for duplicates when the
// work running under the lease in ctx completes its own key, in the
// transaction that holds its writes (pgstore.Store.CompleteTxOutput,
// contrib/sqloutbox's WithTx). It is what the door the work came through
// replays:
//   - a Watermill handler: none (nil); its messages go through an outbox,
//     or to the store's CompleteTx;
//   - a function given to [Do]: DoOptions.CompletionOutput's, or none;
//     its duplicates then get the zero value of its result;
//   - an HTTP handler behind package httpidem: the response it has
//     written so far (status, headers, body), so write it before the
//     transaction commits.
//
// The middleware notices the key completed by its own lease and does not
// complete it again.
func CompletionOutput(ctx context.Context) ([]byte, error) {
	h, ok := heldFrom(ctx)
	if !ok {
		return nil, ErrNoLease
	}
	return h.w.txOutput()
}

// MarkCompletedInTx tells the door that the work running under the lease
// in ctx completed its own key in the transaction that holds its writes
// (pgstore.Store.CompleteTxOutput, with the output of CompletionOutput),
// and that this transaction has committed. The door then records nothing
// more when the work returns without an error: without the mark, it
// completes the key again, which fails, and inspects it to learn that
// this very lease completed it, two store calls. contrib/sqloutbox's
// WithTx calls it after its commit.
//
// Call it only once the commit has returned nil: a mark on a transaction
// that rolled back, or never completed the key, acks the delivery with
// nothing recorded, and its work is lost. It reports whether ctx carries
// a lease.
func MarkCompletedInTx(ctx context.Context) bool {
	h, ok := heldFrom(ctx)
	if ok {
		h.completed.Store(true)
	}
	return ok
}

// run runs the work under the lease and settles the key afterwards.
func (m *Idempotency) run(d *delivery, lease backends.Lease, sentAt time.Time) error {
	d.ev.Lease = lease
	h := &held{lease: lease, w: d.w}
	ctx, cancel := context.WithCancelCause(context.WithValue(d.ctx, leaseCtxKey{}, h))
	k := startKeeper(d.base, m.cfg.Store, lease, m.cfg.LeaseTTL, m.cfg.Timing.StoreTimeout, sentAt, cancel)

	start := time.Now()
	panicked := true
	defer func() {
		cancel(nil)
		if panicked {
			// Let the redelivery run: give the lease up, then let the
			// panic go on to the caller (the router, a Recoverer
			// middleware, net/http).
			if k.err() == nil {
				m.release(d, k, lease)
			}
			k.stop()
			d.ev.HandlerDuration = time.Since(start)
			d.ev.HandlerErr = errors.New("handler panicked")
			_ = m.finish(d, OutcomeHandlerFailed, d.ev.HandlerErr)
		}
	}()
	output, err := d.w.run(ctx)
	panicked = false
	d.ev.HandlerDuration, d.ev.HandlerErr = time.Since(start), err

	if err == nil && h.completed.Load() {
		// The work completed the key with this lease in its own
		// transaction, which committed (contrib/sqloutbox's WithTx):
		// nothing is left to record, whatever the keeper saw since.
		k.stop()
		d.ev.CompletedByHandler = true
		return m.finish(d, OutcomeProcessed, nil)
	}
	if lost := k.err(); lost != nil {
		k.stop()
		if err == nil && m.completedUnder(d, lease) {
			// The work completed the key in its own transaction; a
			// renewal that waited on that transaction's row lock then found
			// the key completed, not lost.
			d.ev.CompletedByHandler = true
			return m.finish(d, OutcomeProcessed, nil)
		}
		// Someone else may hold the key now: never succeed, never publish.
		return m.finish(d, OutcomeLeaseLost, errors.Join(lost, err))
	}
	if err != nil {
		m.release(d, k, lease)
		if errors.Is(err, ErrPermanent) {
			return m.finish(d, OutcomeHandlerFailedPermanently, err)
		}
		return m.finish(d, OutcomeHandlerFailed, err)
	}
	if len(output) > m.cfg.MaxOutputBytes {
		m.release(d, k, lease)
		return m.finish(d, OutcomeOutputTooLarge, fmt.Errorf("%w: the output encodes to %d bytes, the limit is %d",
			ErrOutputTooLarge, len(output), m.cfg.MaxOutputBytes))
	}
	attempts, cerr := m.settle(d, k, func(ctx context.Context) error {
		return m.cfg.Store.Complete(ctx, lease, output)
	})
	lost := k.stop()
	switch {
	case cerr == nil:
		// Only a completion this call confirmed is cached: one made in
		// the work's own transaction is left to the store to report.
		now := time.Now()
		m.cache.put(d.key, backends.AcquireResult{Status: backends.StatusCompleted, CompletedAt: now, Output: output, Fingerprint: d.recFP},
			now.Add(m.cfg.Retention))
		return m.finish(d, OutcomeProcessed, nil)
	case m.completedUnder(d, lease):
		// The work completed the key itself, in the transaction that
		// holds its own writes (pgstore.Store.CompleteTx), if the very
		// first attempt found it so; otherwise an earlier attempt was
		// applied and its reply lost.
		d.ev.CompletedByHandler = attempts == 1 && errors.Is(cerr, backends.ErrLeaseLost)
		return m.finish(d, OutcomeProcessed, nil)
	case errors.Is(cerr, backends.ErrLeaseLost), errors.Is(lost, backends.ErrLeaseLost) && !errors.Is(lost, errNotRenewed):
		// The store says another owner holds the key, or deleted it.
		return m.finish(d, OutcomeLeaseLost, fmt.Errorf("idempotency: at completion: %w", errors.Join(cerr, lost)))
	}
	// The last resort: the work is done, but its completion could not be
	// recorded while the lease could still be kept. Failing would run the
	// work again for certain; succeeding lets a duplicate run it again
	// only if one arrives after the lease has run out.
	d.ev.Err = fmt.Errorf("%w: complete %q: %w", ErrStore, d.key, errors.Join(cerr, lost))
	return m.finish(d, OutcomeProcessedNotRecorded, nil)
}

// runUnprotected runs the work without a lease (KeyErrorRunUnprotected,
// StoreErrorRunUnprotected); why is the error that left no lease. It
// returns the work's own error.
func (m *Idempotency) runUnprotected(d *delivery, why error) error {
	d.ev.Err = why
	start := time.Now()
	_, err := d.w.run(d.ctx)
	d.ev.HandlerDuration, d.ev.HandlerErr = time.Since(start), err
	if err != nil {
		d.ev.Err = errors.Join(d.ev.Err, err)
	}
	_ = m.finish(d, OutcomeUnprotected, nil)
	return err
}

// replay answers a duplicate of a completed key: the work does not run,
// and the output stored with the completion is handed to the door.
func (m *Idempotency) replay(d *delivery, output []byte) error {
	n, err := d.w.replay(output)
	if err != nil {
		return m.storeError(d, fmt.Errorf("%w: key %q: the stored output: %w", ErrStore, d.key, err))
	}
	d.ev.Replayed = n
	return m.finish(d, OutcomeDuplicate, nil)
}
