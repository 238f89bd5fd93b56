package middleware_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// countingStore is memstore, counting Acquire calls, with its Watcher.
type countingStore struct {
	*memstore.Store
	acquires atomic.Int64
}

func (s *countingStore) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	s.acquires.Add(1)
	return s.Store.Acquire(ctx, req)
}

// pollOnly hides memstore's Watcher: the store every waiter must poll.
type pollOnly struct{ backends.Store }

// A duplicate waiting for a holder is woken by the holder's completion,
// not by its next poll: with polls a minute apart it is acked as soon as
// the holder completes, after at most 3 store calls (the first acquire,
// one check when the watch begins, one after the wake). Without a
// Watcher the same wait polls.
func TestWaitingDuplicateWokenByCompletion(t *testing.T) {
	for _, tc := range []struct {
		name  string
		watch bool
	}{{"watched", true}, {"polled", false}} {
		t.Run(tc.name, func(t *testing.T) {
			cs := &countingStore{Store: memstore.New(memstore.Options{})}
			var store backends.Store = cs
			poll := time.Minute
			if !tc.watch {
				store, poll = pollOnly{cs}, 20*time.Millisecond
			}
			m, counters := newMiddleware(t, store, func(c *middleware.Config) {
				c.LeaseTTL = 10 * time.Minute
				c.PollInterval, c.MaxPollInterval = poll, poll
				c.InProgressWait = 5 * time.Minute
			})
			holder, err := cs.Acquire(context.Background(), backends.AcquireRequest{Key: "test:k", Owner: "holder", LeaseTTL: time.Hour, Retention: time.Hour})
			require.NoError(t, err)
			before := cs.acquires.Load()

			done := make(chan error, 1)
			go func() {
				_, err := m.Middleware(ok)(newMsg("k", "x"))
				done <- err
			}()
			// The duplicate is waiting once it has asked the store (and,
			// watched, checked once more).
			require.Eventually(t, func() bool { return cs.acquires.Load()-before >= 2 }, time.Minute, time.Millisecond)
			require.NoError(t, cs.Complete(context.Background(), holder.Lease, nil))
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("the waiting duplicate was not acked within 30s of the completion (its polls are a minute apart when watched)")
			}
			require.EqualValues(t, 1, counters.Count(middleware.OutcomeDuplicate))
			calls := cs.acquires.Load() - before
			if tc.watch {
				require.LessOrEqual(t, calls, int64(3), "store calls for the wait")
			}
			t.Logf("%d store calls for the wait", calls)
		})
	}
}

// deafWatcher claims a healthy watch and never fires: the notifications
// of a subscription lost without the store noticing.
type deafWatcher struct{ *countingStore }

func (deafWatcher) Watch(context.Context, string) (<-chan struct{}, func(), bool) {
	return make(chan struct{}), func() {}, true
}

// noisyWatcher fires every watch at once: a store that wakes without
// cause, or a subscription lost over and over.
type noisyWatcher struct{ *countingStore }

func (noisyWatcher) Watch(context.Context, string) (<-chan struct{}, func(), bool) {
	ch := make(chan struct{})
	close(ch)
	return ch, func() {}, true
}

// startWaiting acquires test:k for another owner and runs a duplicate of
// it through m in the background.
func startWaiting(t *testing.T, cs *countingStore, m *middleware.Idempotency) (backends.Lease, <-chan error) {
	t.Helper()
	holder, err := cs.Acquire(context.Background(), backends.AcquireRequest{Key: "test:k", Owner: "holder", LeaseTTL: time.Hour, Retention: time.Hour})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := m.Middleware(ok)(newMsg("k", "x"))
		done <- err
	}()
	return holder.Lease, done
}

// A watch that never fires does not strand the duplicate: the safety
// polls find the holder's completion.
func TestWaitingDuplicateFallsBackToPolling(t *testing.T) {
	cs := &countingStore{Store: memstore.New(memstore.Options{})}
	m, counters := newMiddleware(t, deafWatcher{cs}, func(c *middleware.Config) {
		c.LeaseTTL = 10 * time.Minute
		c.PollInterval, c.MaxPollInterval = 5*time.Millisecond, 10*time.Millisecond
		c.InProgressWait = 5 * time.Minute
	})
	holder, done := startWaiting(t, cs, m)
	require.Eventually(t, func() bool { return cs.acquires.Load() >= 3 }, time.Minute, time.Millisecond)
	require.NoError(t, cs.Complete(context.Background(), holder, nil))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the duplicate of a deaf watch was not acked within a minute of the completion")
	}
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeDuplicate))
}

// A watch that fires without cause costs no more store calls than
// polling does: the first wake is answered at once, later ones at the
// poll backoff.
func TestSpuriousWakesArePacedLikePolls(t *testing.T) {
	cs := &countingStore{Store: memstore.New(memstore.Options{})}
	const wait = time.Second
	m, counters := newMiddleware(t, noisyWatcher{cs}, func(c *middleware.Config) {
		c.LeaseTTL = 10 * time.Minute
		c.PollInterval, c.MaxPollInterval = 50*time.Millisecond, 100*time.Millisecond
		c.InProgressWait = wait
	})
	_, done := startWaiting(t, cs, m)
	select {
	case err := <-done:
		require.ErrorAs(t, err, new(*middleware.InProgressError))
	case <-time.After(time.Minute):
		t.Fatal("the wait did not end")
	}
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeInProgress))
	// Polling a second at 50, 100, 100… ms asks about 12 times; a wake
	// answered at once each time would ask thousands of times. Slow
	// scheduling only lowers the count.
	calls := cs.acquires.Load()
	require.Less(t, calls, int64(40), "store calls in a %v wait", wait)
	t.Logf("%d store calls in a %v wait woken without cause", calls, wait)
}
