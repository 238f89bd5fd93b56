package middleware

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// guard keeps new work from crowding out lease keeping, and a failing
// store from being hammered.
//
//   - At most Config.MaxConcurrentAcquires Acquire calls are in flight at
//     once; other deliveries queue for a slot in arrival order. Renewals,
//     completions and releases never take a slot, so with the store
//     client's pool larger than the bound they always find a connection,
//     however many new deliveries arrive.
//   - Once a call fails, acquisitions become probes: one at a time, the
//     n-th round of consecutive failures followed by the n-th pause of
//     Timing.StoreBackoff before the next, however many deliveries wait. The first call that succeeds
//     ends the probing. Failures of calls that were in flight together
//     count as one round, so a burst of timeouts is one failure.
type guard struct {
	slots   chan struct{}
	backoff Backoff

	// failing mirrors failures > 0 and round mirrors the round, both
	// written under mu, so that calls while the store is healthy take no
	// lock.
	failing atomic.Bool
	round   atomic.Uint64 // bumped whenever failures changes

	mu       sync.Mutex
	failures int           // consecutive rounds of failed calls
	next     time.Time     // while failing, when the next probe may go out
	probing  bool          // a probe is in flight
	wake     chan struct{} // closed (and replaced) when a probe ends
	lastErr  error
}

// ticket is an admitted call, to hand back to record.
type ticket struct {
	round uint64
	probe bool
}

func newGuard(concurrency int, backoff Backoff) *guard {
	return &guard{slots: make(chan struct{}, concurrency), backoff: backoff, wake: make(chan struct{})}
}

// enter takes a slot, waiting for one until ctx is done.
func (g *guard) enter(ctx context.Context) error {
	select {
	case g.slots <- struct{}{}:
		return nil
	default:
	}
	select {
	case g.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// leave gives the slot back.
func (g *guard) leave() { <-g.slots }

// errBackingOff is returned by admit when the store is failing and the
// caller's deadline comes before its turn.
var errBackingOff = errors.New("backing off after store failures")

// admit returns at once while the store is healthy. While it is failing,
// it waits until the caller may send the next probe. If that cannot be
// before ctx's deadline, it returns an error wrapping errBackingOff and
// the last store error, at once when the wait is known to be too long.
// Pass the ticket to record.
func (g *guard) admit(ctx context.Context) (ticket, error) {
	if !g.failing.Load() {
		return ticket{round: g.round.Load()}, nil
	}
	dl, hasDL := ctx.Deadline()
	for {
		g.mu.Lock()
		if g.failures == 0 {
			t := ticket{round: g.round.Load()}
			g.mu.Unlock()
			return t, nil
		}
		now := time.Now()
		if !g.probing && !now.Before(g.next) {
			g.probing = true
			t := ticket{round: g.round.Load(), probe: true}
			g.mu.Unlock()
			return t, nil
		}
		if !g.probing && hasDL && g.next.After(dl) {
			return ticket{}, g.backingOffLocked()
		}
		wake := g.wake
		var timer *time.Timer
		var turn <-chan time.Time // nil while a probe is out: wait for it
		if !g.probing {
			timer = time.NewTimer(g.next.Sub(now))
			turn = timer.C
		}
		g.mu.Unlock()
		select {
		case <-wake:
		case <-turn:
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			g.mu.Lock()
			return ticket{}, errors.Join(g.backingOffLocked(), ctx.Err())
		}
	}
}

// backingOffLocked returns the error for a caller that gives up waiting,
// and unlocks g.mu.
func (g *guard) backingOffLocked() error {
	err := fmt.Errorf("%w (%d rounds; last: %w)", errBackingOff, g.failures, g.lastErr)
	g.mu.Unlock()
	return err
}

// record notes the result of an admitted call. Every error counts,
// permanent ones included, so that a store that refuses every call (a
// missing table) is not hammered either.
func (g *guard) record(t ticket, err error) {
	if err == nil && !t.probe && !g.failing.Load() {
		return // healthy, and still so
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	round := g.round.Load()
	switch {
	case err == nil:
		if g.failures > 0 {
			g.failures, g.next, g.lastErr = 0, time.Time{}, nil
			g.failing.Store(false)
			g.round.Add(1)
		}
	case t.round == round:
		g.failures++
		g.failing.Store(true)
		g.round.Add(1)
		g.lastErr = err
		g.next = time.Now().Add(jitter(g.backoffLocked()))
	}
	if t.probe {
		g.probing = false
	}
	if t.probe || err == nil && round != g.round.Load() {
		close(g.wake)
		g.wake = make(chan struct{})
	}
}

// backoffLocked is the spacing, before jitter, after the current number
// of failed rounds.
func (g *guard) backoffLocked() time.Duration {
	return g.backoff.Pause(max(g.failures-1, 0))
}

// pause returns how long a delivery that failed on the store waits
// before it is nacked: half to all of Timing.StoreBackoff.Max, at random.
// A broker that redelivers at once then brings each such delivery back at
// most about once per StoreBackoff.Max/2.
func (g *guard) pause() time.Duration {
	return g.backoff.Max/2 + rand.N(g.backoff.Max/2+1)
}
