package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
)

type leaseCtxKey struct{}

// LeaseFromContext returns the lease the handler runs under. Inside a
// handler, call it with msg.Context(). Pass Lease.Token to the systems the
// handler writes to, so they can reject writes from a holder whose lease
// was taken over (fencing).
func LeaseFromContext(ctx context.Context) (backends.Lease, bool) {
	l, ok := ctx.Value(leaseCtxKey{}).(backends.Lease)
	return l, ok
}

// run runs the handler under the lease and settles the key afterwards.
func (m *Idempotency) run(d *delivery, h message.HandlerFunc, lease backends.Lease, sentAt time.Time) ([]*message.Message, error) {
	d.ev.Lease = lease
	orig := d.msg.Context()
	hctx, cancel := context.WithCancelCause(context.WithValue(orig, leaseCtxKey{}, lease))
	k := startKeeper(d.ctx, m.cfg.Store, lease, m.cfg.LeaseTTL, m.cfg.Timing.StoreTimeout, sentAt, cancel)
	d.msg.SetContext(hctx)

	start := time.Now()
	panicked := true
	defer func() {
		d.msg.SetContext(orig)
		cancel(nil)
		if panicked {
			// Let the redelivery run: give the lease up, then let the
			// panic go on to the router (or a Recoverer middleware).
			if k.err() == nil {
				m.release(d, k, lease)
			}
			k.stop()
			d.ev.HandlerDuration = time.Since(start)
			d.ev.HandlerErr = errors.New("handler panicked")
			m.finish(d, OutcomeHandlerFailed, nil, d.ev.HandlerErr)
		}
	}()
	out, err := h(d.msg)
	panicked = false
	d.ev.HandlerDuration, d.ev.HandlerErr = time.Since(start), err

	if lost := k.err(); lost != nil {
		k.stop()
		if err == nil && m.completedUnder(d, lease) {
			// The handler completed the key in its own transaction; a
			// renewal that waited on that transaction's row lock then found
			// the key completed, not lost.
			d.ev.CompletedByHandler = true
			return m.finish(d, OutcomeProcessed, out, nil)
		}
		// Someone else may hold the key now: never ack, never publish.
		return m.finish(d, OutcomeLeaseLost, nil, errors.Join(lost, err))
	}
	if err != nil {
		m.release(d, k, lease)
		if errors.Is(err, ErrPermanent) {
			return m.finish(d, OutcomeHandlerFailedPermanently, nil, err)
		}
		return m.finish(d, OutcomeHandlerFailed, nil, err)
	}
	encoded := backends.EncodeOutput(out)
	if len(encoded) > m.cfg.MaxOutputBytes {
		m.release(d, k, lease)
		return m.finish(d, OutcomeOutputTooLarge, nil, fmt.Errorf("%w: %d messages encode to %d bytes, the limit is %d",
			ErrOutputTooLarge, len(out), len(encoded), m.cfg.MaxOutputBytes))
	}
	attempts, cerr := m.settle(d, k, func(ctx context.Context) error {
		return m.cfg.Store.Complete(ctx, lease, encoded)
	})
	lost := k.stop()
	switch {
	case cerr == nil:
		return m.finish(d, OutcomeProcessed, out, nil)
	case m.completedUnder(d, lease):
		// The handler completed the key itself, in the transaction that
		// holds its own writes (pgstore.Store.CompleteTx), if the very
		// first attempt found it so; otherwise an earlier attempt was
		// applied and its reply lost.
		d.ev.CompletedByHandler = attempts == 1 && errors.Is(cerr, backends.ErrLeaseLost)
		return m.finish(d, OutcomeProcessed, out, nil)
	case errors.Is(cerr, backends.ErrLeaseLost), errors.Is(lost, backends.ErrLeaseLost) && !errors.Is(lost, errNotRenewed):
		// The store says another owner holds the key, or deleted it.
		return m.finish(d, OutcomeLeaseLost, nil, fmt.Errorf("idempotency: at completion: %w", errors.Join(cerr, lost)))
	}
	// The last resort: the work is done, but its completion could not be
	// recorded while the lease could still be kept. Nacking would run the
	// handler again for certain; acking lets a duplicate run it again only
	// if one arrives after the lease has run out.
	d.ev.Err = fmt.Errorf("%w: complete %q: %w", ErrStore, d.key, errors.Join(cerr, lost))
	m.finish(d, OutcomeProcessedNotRecorded, nil, nil)
	return out, nil
}

// runUnprotected runs the handler without a lease (KeyErrorRunUnprotected,
// StoreErrorRunUnprotected); why is the error that left no lease.
func (m *Idempotency) runUnprotected(d *delivery, h message.HandlerFunc, why error) ([]*message.Message, error) {
	d.ev.Err = why
	start := time.Now()
	out, err := h(d.msg)
	d.ev.HandlerDuration, d.ev.HandlerErr = time.Since(start), err
	if err != nil {
		d.ev.Err = errors.Join(d.ev.Err, err)
	}
	m.finish(d, OutcomeUnprotected, nil, nil)
	return out, err
}

// replay answers a duplicate of a completed key: the handler does not run,
// and the output stored with the completion is returned for the router to
// publish again.
func (m *Idempotency) replay(d *delivery, output []byte) ([]*message.Message, error) {
	out, err := backends.DecodeOutput(output)
	if err != nil {
		return m.storeError(d, fmt.Errorf("key %q: %w", d.key, err))
	}
	d.ev.Replayed = len(out)
	for _, r := range out {
		for _, k := range m.cfg.ReplayDropMetadata {
			delete(r.Metadata, k)
		}
	}
	return m.finish(d, OutcomeDuplicate, out, nil)
}
