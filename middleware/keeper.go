package middleware

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// The lease keeper's rhythm, in fractions of the lease TTL (documented at
// Config.LeaseTTL).
const (
	// renewEvery: the lease is renewed every TTL/renewEvery.
	renewEvery = 3
	// leaseMargin: the lease counts as lost TTL/leaseMargin before the
	// local deadline, and a failed renewal is tried again every
	// TTL/leaseMargin.
	leaseMargin = 10
)

// errNotRenewed is wrapped, with backends.ErrLeaseLost, by the loss of a
// lease the keeper could not renew before it would expire: lost for the
// handler, though the store did not say that another owner has it.
var errNotRenewed = errors.New("not renewed before it would expire")

// keeper renews a lease every ttl/3 while the handler runs. It keeps a
// local deadline by which the lease is certainly still held: the time the
// last successful Acquire or Renew was sent, plus the TTL. The server set
// the expiry after that moment, so the local deadline is never later than
// the server's. If the lease is reported lost, or cannot be renewed before
// that deadline (less a margin), the keeper cancels the handler's context
// with a cause wrapping backends.ErrLeaseLost.
//
// It runs on a timer rather than a goroutine of its own, so a handler that
// finishes within ttl/3 costs no goroutine at all. It keeps running after
// the handler returns, while the completion or release is retried, until
// stop is called.
type keeper struct {
	store   backends.Store
	lease   backends.Lease
	ttl     time.Duration
	margin  time.Duration
	timeout time.Duration
	cancel  context.CancelCauseFunc
	base    context.Context // not cancelled by ack or nack

	mu          sync.Mutex
	timer       *time.Timer
	deadline    time.Time
	stopped     bool
	lost        error
	lostCh      chan struct{}      // closed when lost is set; made by done, if ever
	renewCancel context.CancelFunc // of the renewal under way, if any
	running     sync.WaitGroup
}

// startKeeper starts renewing lease. base must not be cancelled by the
// message's ack or nack; cancel cancels the handler's context.
func startKeeper(base context.Context, store backends.Store, lease backends.Lease, ttl, timeout time.Duration, sentAt time.Time, cancel context.CancelCauseFunc) *keeper {
	k := &keeper{
		store:    store,
		lease:    lease,
		ttl:      ttl,
		margin:   ttl / leaseMargin,
		timeout:  timeout,
		cancel:   cancel,
		base:     base,
		deadline: sentAt.Add(ttl),
	}
	k.mu.Lock()
	k.timer = time.AfterFunc(ttl/renewEvery, k.tick)
	k.mu.Unlock()
	return k
}

func (k *keeper) tick() {
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		return
	}
	k.running.Add(1)
	cutoff := k.deadline.Add(-k.margin)
	until := time.Now().Add(k.timeout)
	if cutoff.Before(until) {
		until = cutoff
	}
	ctx, cancel := context.WithDeadline(k.base, until)
	k.renewCancel = cancel
	k.mu.Unlock()
	defer k.running.Done()

	sent := time.Now()
	err := k.store.Renew(ctx, k.lease, k.ttl)
	cancel()

	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return // stop raced with the renewal; its result no longer matters
	}
	switch {
	case err == nil:
		k.deadline = sent.Add(k.ttl)
		k.timer.Reset(k.ttl / renewEvery)
	case errors.Is(err, backends.ErrLeaseLost):
		k.lose(fmt.Errorf("idempotency: renewal: %w", err))
	case !time.Now().Before(cutoff):
		k.lose(fmt.Errorf("idempotency: %w: %w: %w", backends.ErrLeaseLost, errNotRenewed, err))
	default:
		// A transient failure: try again soon, while the lease still holds.
		k.timer.Reset(min(k.ttl/leaseMargin, time.Until(cutoff)))
	}
}

// lose records the loss and cancels the handler. The caller holds k.mu.
func (k *keeper) lose(err error) {
	k.lost = err
	if k.lostCh != nil {
		close(k.lostCh)
	}
	k.cancel(err)
}

// done is closed when the lease is lost. The channel is made on first use:
// most deliveries never need it.
func (k *keeper) done() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lostCh == nil {
		if k.lost != nil {
			return closedChan
		}
		k.lostCh = make(chan struct{})
	}
	return k.lostCh
}

// err returns the error the lease was lost with, or nil while it holds.
func (k *keeper) err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lost
}

// stop stops renewing, waits for a renewal under way, and returns the
// error the lease was lost with, if it was. Calling it again is harmless.
func (k *keeper) stop() error {
	k.mu.Lock()
	k.stopped = true
	k.timer.Stop()
	if k.renewCancel != nil {
		k.renewCancel()
	}
	k.mu.Unlock()
	k.running.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lost
}
