package middleware

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// waitForHolder polls the store, with backoff, until the holder of the key
// completes or gives it up, or the wait ends. It never acks: the caller
// turns a result still in progress into a nack. A store that can wake
// waiters (backends.Watcher) is watched instead: the store is asked again
// when the watch fires, when the holder's lease runs out, and otherwise
// only every watchedPollFactor × MaxPollInterval, as a safety net. While
// the store cannot watch (its subscription lost and not yet back), the
// wait polls with backoff and tries to watch again after each poll that
// finds the key still in progress, so that it is woken again once the
// store can watch.
func (m *Idempotency) waitForHolder(d *delivery, res backends.AcquireResult) (backends.AcquireResult, time.Time, error) {
	budget := m.cfg.InProgressWait
	if budget == 0 {
		budget = min(res.Remaining+m.cfg.PollInterval, m.cfg.LeaseTTL)
	}
	start := time.Now()
	deadline := start.Add(budget)
	interval := m.cfg.PollInterval
	var sentAt time.Time
	defer func() { d.ev.Waited = time.Since(start) }()
	w := &waiter{m: m, d: d, end: func() {}}
	defer w.stop()
	w.rewatch()
	var lastAsk time.Time
	for wakes := 0; res.Status == backends.InProgress; {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		// Sleep for the backoff interval with ±20% jitter, or while
		// watched for the safety interval, but wake when the holder's
		// lease runs out or the store says the key changed, and never
		// past the deadline. A change before the watch was in place
		// needs no look of its own: the store wakes a watch at once if
		// the key is no longer held when it is placed
		// (backends.Watcher).
		pause := jitter(interval)
		if w.watching() {
			pause = jitter(watchedPollFactor * m.cfg.MaxPollInterval)
		}
		pause = min(pause, res.Remaining+time.Millisecond, left)
		timer := time.NewTimer(pause)
		select {
		case <-d.msg.Context().Done():
			timer.Stop()
			return res, sentAt, fmt.Errorf("waiting for key %q: %w", d.key, d.msg.Context().Err())
		case <-timer.C:
		case <-w.changed:
			timer.Stop()
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
			if wait := time.Until(lastAsk.Add(interval)); wait > 0 {
				sleepCtx(d.msg.Context(), min(wait, time.Until(deadline)))
				if err := d.msg.Context().Err(); err != nil {
					return res, sentAt, fmt.Errorf("waiting for key %q: %w", d.key, err)
				}
			}
		}
		interval = min(interval*2, m.cfg.MaxPollInterval)

		var err error
		lastAsk = time.Now()
		res, sentAt, err = m.acquire(d)
		if err != nil {
			return res, sentAt, fmt.Errorf("%w: acquire %q while waiting: %w", ErrStore, d.key, err)
		}
		if m.mismatch(d, res) {
			return res, sentAt, nil
		}
		// Not watching: after the first wake above, or because the store
		// could not watch when last asked. Try again: the stores here
		// report not ok at once, without a round trip, while they cannot
		// watch, so trying costs nothing then, and the polling ends as
		// soon as they can watch again.
		if !w.watching() && res.Status == backends.InProgress {
			w.rewatch()
		}
	}
	// The wait ends on what the store says after its deadline. On a
	// starved machine the last look can be from well before it (the
	// first, even, from before the wait began), and the holder may have
	// finished, failed or run out of lease since.
	if res.Status == backends.InProgress && budget > 0 && lastAsk.Before(deadline) {
		var err error
		res, sentAt, err = m.acquire(d)
		if err != nil {
			return res, sentAt, fmt.Errorf("%w: acquire %q while waiting: %w", ErrStore, d.key, err)
		}
	}
	return res, sentAt, nil
}

// watchedPollFactor × MaxPollInterval is the pause between two safety
// looks at the store while a Watcher watches the key.
const watchedPollFactor = 10

// waiter is a waiting duplicate's watch on its key, if the store can
// wake it (backends.Watcher). changed is nil while nothing is watched.
type waiter struct {
	m       *Idempotency
	d       *delivery
	changed <-chan struct{}
	end     func()
}

// rewatch starts a new watch, waiting at most StoreTimeout for it to be
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
	ctx, cancel := context.WithTimeout(w.d.msg.Context(), w.m.cfg.StoreTimeout)
	defer cancel()
	changed, end, ok := watcher.Watch(ctx, w.d.key)
	w.end = end
	if ok {
		w.changed = changed
	}
}

func (w *waiter) watching() bool { return w.changed != nil }

func (w *waiter) stop() { w.end() }
