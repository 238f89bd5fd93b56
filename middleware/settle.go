package middleware

import (
	"context"
	"errors"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// settle runs op (a Complete or Release of the lease) until it succeeds or
// fails for good, retrying transient failures with Timing.StoreBackoff's
// pauses, at most LeaseTTL/10 each, while the keeper still holds the lease,
// and for at most LeaseTTL (or StoreTimeout if longer) in all. Each attempt
// is bounded by StoreTimeout. The keeper keeps renewing meanwhile, so a
// slow or briefly unreachable store delays the settlement instead of
// letting the lease run out under finished work. It returns the number of
// attempts and op's last error.
func (m *Idempotency) settle(d *delivery, k *keeper, op func(ctx context.Context) error) (attempts int, err error) {
	t := m.cfg.Timing
	limit := time.Now().Add(max(m.cfg.LeaseTTL, t.StoreTimeout))
	b := backoff{Backoff: Backoff{Initial: t.StoreBackoff.Initial, Max: min(t.StoreBackoff.Max, max(m.cfg.LeaseTTL/leaseMargin, t.StoreBackoff.Initial))}}
	var lost <-chan struct{} // nil, never ready, without a keeper
	for {
		ctx := withDeadline(d.base, t.StoreTimeout)
		err = op(ctx)
		ctx.stop()
		attempts++
		if !retryable(err) || errors.Is(err, backends.ErrLeaseLost) {
			return attempts, err
		}
		if lost == nil && k != nil {
			lost = k.done() // made on first use: most settlements never retry
		}
		if !b.wait(d.base, limit, lost) {
			return attempts, err
		}
	}
}

// completedUnder reports whether the key was completed under lease: by the
// same owner with the same fencing token, so by this very attempt. It
// retries transient failures with Timing.StoreBackoff's pauses within
// StoreTimeout: its answer decides between an ack and a nack.
func (m *Idempotency) completedUnder(d *delivery, lease backends.Lease) bool {
	ctx := withDeadline(d.base, m.cfg.Timing.StoreTimeout)
	defer ctx.stop()
	b := backoff{Backoff: m.cfg.Timing.StoreBackoff}
	for {
		rec, err := m.cfg.Store.Inspect(ctx, lease.Key)
		if !retryable(err) || errors.Is(err, backends.ErrNotFound) {
			return err == nil && rec.State == backends.StateCompleted && rec.Owner == lease.Owner && rec.Token == lease.Token
		}
		if !b.wait(ctx, ctx.deadline, nil) {
			return false
		}
	}
}

// release gives the lease up after a failure, so the redelivery can take
// the key at once, retrying while the keeper holds the lease (see settle),
// then stops the keeper (k may be nil: the lease was never kept). If it
// still fails, the failure is logged: the lease then runs out by itself
// within LeaseTTL.
func (m *Idempotency) release(d *delivery, k *keeper, lease backends.Lease) {
	_, err := m.settle(d, k, func(ctx context.Context) error { return m.cfg.Store.Release(ctx, lease) })
	if k != nil {
		k.stop()
	}
	if err != nil && !errors.Is(err, backends.ErrLeaseLost) {
		m.cfg.Logger.Error("idempotency: release failed; the lease will run out by itself", err, m.fields(d))
	}
}
