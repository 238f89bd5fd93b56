package middleware

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// waitForHolder waits while the key is in progress, until its holder
// completes or gives it up, or the wait (Timing.InProgressWait) ends. It
// never acks: the caller turns a key still in progress into a nack. It
// looks at the store with Timing.Poll's pauses; a store that can wake
// waiters (backends.Watcher) is watched instead, and asked again when the
// watch fires, when the holder's lease runs out, and otherwise every
// Timing.WatchedPoll, as a safety net. While the store cannot watch (its
// subscription lost and not yet back), the wait polls and tries to watch
// again after each look that finds the key still in progress, so that it
// is woken again once the store can watch.
func (m *Idempotency) waitForHolder(d *delivery, res backends.AcquireResult) (backends.AcquireResult, time.Time, error) {
	t := m.cfg.Timing
	budget := t.InProgressWait
	if budget == 0 {
		budget = min(res.Remaining+t.Poll.Initial, m.cfg.LeaseTTL)
	}
	start := time.Now()
	deadline := start.Add(budget)
	defer func() { d.ev.Waited = time.Since(start) }()
	poll := backoff{Backoff: t.Poll}
	w := &waiter{m: m, d: d, end: func() {}}
	defer w.stop()
	w.rewatch()
	var sentAt, lastAsk time.Time
	for wakes := 0; res.Status == backends.StatusInProgress; {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		// Sleep for the poll pause, or while watched for the safety
		// pause, but wake when the holder's lease runs out or the store
		// says the key changed, and never past the deadline. A change
		// before the watch was in place needs no look of its own: the
		// store wakes a watch at once if the key is no longer held when
		// it is placed (backends.Watcher).
		interval := poll.next()
		pause := interval
		if w.watching() {
			pause = jitter(t.WatchedPoll)
		}
		switch sleep(d.ctx, min(pause, res.Remaining+time.Millisecond, left), w.changed) {
		case cancelled:
			return res, sentAt, fmt.Errorf("waiting for key %q: %w", d.key, d.ctx.Err())
		case woken:
			wakes++
			if wakes == 1 {
				// Most likely the holder finished: ask the store at once,
				// and watch again only if the key is still in progress.
				w.changed = nil
				break
			}
			// Later wakes (a new holder, a lost subscription, a store
			// that wakes without cause) watch again first, so that the
			// ask covers any change until the new watch is in place, and
			// ask no sooner than the poll backoff allows.
			w.rewatch()
			if sleep(d.ctx, min(time.Until(lastAsk.Add(interval)), time.Until(deadline)), nil) == cancelled {
				return res, sentAt, fmt.Errorf("waiting for key %q: %w", d.key, d.ctx.Err())
			}
		}

		var err error
		lastAsk = time.Now()
		if res, sentAt, err = m.look(d); err != nil || m.mismatched(d, res) {
			return res, sentAt, err
		}
		// Not watching: after the first wake above, or because the store
		// could not watch when last asked. Try again: the stores here
		// report not ok at once, without a round trip, while they cannot
		// watch, so trying costs nothing then, and the polling ends as
		// soon as they can watch again.
		if !w.watching() && res.Status == backends.StatusInProgress {
			w.rewatch()
		}
	}
	// The wait ends on what the store says after its deadline. On a
	// starved machine the last look can be from well before it (the
	// first, even, from before the wait began), and the holder may have
	// finished, failed or run out of lease since.
	if res.Status == backends.StatusInProgress && budget > 0 && lastAsk.Before(deadline) {
		return m.look(d)
	}
	return res, sentAt, nil
}

// look asks the store again while waiting: an Acquire, which takes the key
// if the holder gave it up.
func (m *Idempotency) look(d *delivery) (backends.AcquireResult, time.Time, error) {
	res, sentAt, err := m.acquire(d)
	if err != nil {
		return res, sentAt, fmt.Errorf("%w: acquire %q while waiting: %w", ErrStore, d.key, err)
	}
	return res, sentAt, nil
}

// waiter is a waiting duplicate's watch on its key, if the store can
// wake it (backends.Watcher). changed is nil while nothing is watched.
type waiter struct {
	m       *Idempotency
	d       *delivery
	changed <-chan struct{}
	end     func()
}

// rewatch starts a new watch, waiting at most Timing.StoreTimeout for it to be
// in place, and then ends the current one, if any: a store that keeps a
// subscription per key keeps it across the two.
func (w *waiter) rewatch() {
	old := w.end
	defer old()
	w.changed, w.end = nil, func() {}
	watcher, ok := w.m.cfg.Store.(backends.Watcher)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(w.d.ctx, w.m.cfg.Timing.StoreTimeout)
	defer cancel()
	changed, end, ok := watcher.Watch(ctx, w.d.key)
	w.end = end
	if ok {
		w.changed = changed
	}
}

func (w *waiter) watching() bool { return w.changed != nil }

func (w *waiter) stop() { w.end() }
