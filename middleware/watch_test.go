package middleware_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// countingStore is memstore, counting Acquire and Watch calls, with its
// Watcher.
type countingStore struct {
	*memstore.Store
	acquires, watches atomic.Int64
}

func (s *countingStore) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	s.acquires.Add(1)
	return s.Store.Acquire(ctx, req)
}

func (s *countingStore) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	s.watches.Add(1)
	return s.Store.Watch(ctx, key)
}

// pollOnly hides memstore's Watcher: the store every waiter must poll.
type pollOnly struct{ backends.Store }

// A duplicate waiting for a holder is woken by the holder's completion,
// not by its next poll: with polls a minute apart it is acked as soon as
// the holder completes, after 3 store calls (the first acquire, the
// watch, one acquire after the wake). Without a Watcher the same wait
// polls.
func TestWaitingDuplicateWokenByCompletion(t *testing.T) {
	for _, tc := range []struct {
		name  string
		watch bool
	}{{"watched", true}, {"polled", false}} {
		t.Run(tc.name, func(t *testing.T) {
			cs := &countingStore{Store: newMemstore()}
			var store backends.Store = cs
			poll := time.Minute
			if !tc.watch {
				store, poll = pollOnly{cs}, 20*time.Millisecond
			}
			m, counters := newMiddleware(t, store, func(c *middleware.Config) {
				c.LeaseTTL = 10 * time.Minute
				c.Timing.Poll = middleware.Backoff{Initial: poll, Max: poll}
				c.Timing.InProgressWait = 5 * time.Minute
			})
			holder, err := cs.Acquire(context.Background(), backends.AcquireRequest{Key: "test:k", Owner: "holder", LeaseTTL: time.Hour, Retention: time.Hour})
			require.NoError(t, err)
			before := cs.acquires.Load()

			done := deliverDuplicate(m)
			// The duplicate is waiting once it watches, or, polled, once it
			// has asked the store twice.
			require.Eventually(t, func() bool {
				if tc.watch {
					return cs.watches.Load() >= 1
				}
				return cs.acquires.Load()-before >= 2
			}, time.Minute, time.Millisecond)
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
				require.EqualValues(t, 2, calls, "Acquires for the wait: the first, and one when woken")
				require.EqualValues(t, 1, cs.watches.Load(), "Watch calls for the wait")
			}
			t.Logf("%d Acquires and %d Watch calls for the wait", calls, cs.watches.Load())
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
	return holder.Lease, deliverDuplicate(m)
}

// deliverDuplicate runs a delivery of test:k through m in the background;
// its result comes on the channel returned.
func deliverDuplicate(m *middleware.Idempotency) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := m.Middleware(ok)(newMsg("k", "x"))
		done <- err
	}()
	return done
}

// A watch that never fires does not strand the duplicate: the safety
// polls find the holder's completion.
func TestWaitingDuplicateFallsBackToPolling(t *testing.T) {
	cs := &countingStore{Store: newMemstore()}
	m, counters := newMiddleware(t, deafWatcher{cs}, func(c *middleware.Config) {
		c.LeaseTTL = 10 * time.Minute
		c.Timing.Poll = middleware.Backoff{Initial: 5 * time.Millisecond, Max: 10 * time.Millisecond}
		c.Timing.InProgressWait = 5 * time.Minute
	})
	holder, done := startWaiting(t, cs, m)
	require.Eventually(t, func() bool { return cs.acquires.Load() >= 3 }, time.Minute, time.Millisecond)
	completeAndRequireAcked(t, cs, holder, done, counters)
}

// completeAndRequireAcked completes the holder's lease and requires the
// duplicate waiting on done to be acked, as a duplicate, within a minute:
// far above any poll or safety look the tests configure, so that only a
// duplicate stranded in its wait fails it.
func completeAndRequireAcked(t *testing.T, cs *countingStore, holder backends.Lease, done <-chan error, counters *middleware.Counters) {
	t.Helper()
	require.NoError(t, cs.Complete(context.Background(), holder, nil))
	requireAckedDuplicate(t, done, counters)
}

// requireAckedDuplicate requires the delivery on done to end acked, as a
// duplicate, within a minute.
func requireAckedDuplicate(t *testing.T, done <-chan error, counters *middleware.Counters) {
	t.Helper()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the waiting duplicate was not acked within a minute of the completion")
	}
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeDuplicate))
}

// A watch that fires without cause costs no more store calls than
// polling does: the first wake is answered at once, later ones at the
// poll backoff.
func TestSpuriousWakesArePacedLikePolls(t *testing.T) {
	cs := &countingStore{Store: newMemstore()}
	const wait = time.Second
	m, counters := newMiddleware(t, noisyWatcher{cs}, func(c *middleware.Config) {
		c.LeaseTTL = 10 * time.Minute
		c.Timing.Poll = middleware.Backoff{Initial: 50 * time.Millisecond, Max: 100 * time.Millisecond}
		c.Timing.InProgressWait = wait
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

// outageWatcher is memstore whose Watch reports not ok while down: a
// store whose subscription is lost and not yet back.
type outageWatcher struct {
	*countingStore
	down    atomic.Bool
	refused atomic.Int64 // Watch calls while down
	placed  atomic.Int64 // watches in place
	atWatch atomic.Int64 // Acquires before the last watch was placed
}

func (s *outageWatcher) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	if s.down.Load() {
		s.refused.Add(1)
		return nil, func() {}, false
	}
	s.atWatch.Store(s.acquires.Load())
	s.placed.Add(1)
	return s.Store.Watch(ctx, key)
}

// A duplicate that began waiting while the store could not watch tries
// to watch again after its later polls, and once the store can watch it
// is woken by the holder's completion rather than by a poll: from the
// watch on, one look at the store, when woken.
func TestWaitingDuplicateWatchesOnceStoreCanWatch(t *testing.T) {
	cs := &countingStore{Store: newMemstore()}
	store := &outageWatcher{countingStore: cs}
	store.down.Store(true)
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.LeaseTTL = 10 * time.Minute
		// Polls soon apart while the store cannot watch; a safety look
		// only every 10 × 2s (±20%) once it watches.
		c.Timing.Poll = middleware.Backoff{Initial: 5 * time.Millisecond, Max: 2 * time.Second}
		c.Timing.InProgressWait = 5 * time.Minute
	})
	holder, done := startWaiting(t, cs, m)
	require.Eventually(t, func() bool { return store.refused.Load() >= 3 }, time.Minute, time.Millisecond,
		"the duplicate tries to watch again after its polls")
	store.down.Store(false)
	require.Eventually(t, func() bool { return store.placed.Load() == 1 },
		time.Minute, time.Millisecond, "the duplicate watches once the store can")
	select {
	case err := <-done:
		t.Fatalf("the duplicate ended before the holder completed: %v", err)
	default:
	}
	completeAndRequireAcked(t, cs, holder, done, counters)
	require.EqualValues(t, 1, cs.acquires.Load()-store.atWatch.Load(),
		"looks at the store from the watch on: one, when woken")
	require.EqualValues(t, 1, store.placed.Load(), "one watch")
	t.Logf("Watch reported not ok %d times before the store could watch", store.refused.Load())
}

// completingWatcher completes the holder's lease just before each watch
// is placed: the change a waiting duplicate would miss if it counted only
// on notifications sent after its watch.
type completingWatcher struct {
	*countingStore
	holder backends.Lease
}

func (s *completingWatcher) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	_ = s.Store.Complete(ctx, s.holder, nil)
	return s.countingStore.Watch(ctx, key)
}

// A holder that completes after the duplicate found the key in progress
// but before its watch is in place is not waited for until the next
// safety look (ten minutes here): the store wakes a watch of a key no
// longer held at once, and the duplicate is acked after one more Acquire.
func TestCompletionBeforeTheWatchIsInPlace(t *testing.T) {
	cs := &countingStore{Store: newMemstore()}
	holder, err := cs.Acquire(context.Background(), backends.AcquireRequest{Key: "test:k", Owner: "holder", LeaseTTL: time.Hour, Retention: time.Hour})
	require.NoError(t, err)
	m, counters := newMiddleware(t, &completingWatcher{countingStore: cs, holder: holder.Lease}, func(c *middleware.Config) {
		c.LeaseTTL = 10 * time.Minute
		c.Timing.Poll = middleware.Backoff{Initial: time.Minute, Max: time.Minute}
		c.Timing.InProgressWait = 5 * time.Minute
	})
	before := cs.acquires.Load()
	requireAckedDuplicate(t, deliverDuplicate(m), counters)
	require.EqualValues(t, 2, cs.acquires.Load()-before, "Acquires: the first, and one when woken")
}

// stalledWatch is memstore whose Watch returns only after stall, as a
// waiting goroutine that a starved machine does not run for that long.
type stalledWatch struct {
	*memstore.Store
	stall time.Duration
}

func (s *stalledWatch) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	time.Sleep(s.stall)
	return s.Store.Watch(ctx, key)
}

// A wait whose whole budget passes before its first look (a starved
// machine) still ends on what the store says after its deadline: the
// holder's lease ran out meanwhile, so the duplicate takes over instead of
// being nacked on a look from before the wait began.
func TestWaitEndsOnALookAfterItsDeadline(t *testing.T) {
	mem := newMemstore()
	store := &stalledWatch{Store: mem, stall: 200 * time.Millisecond}
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.Timing.Poll.Initial = 5 * time.Millisecond
	})
	_, err := mem.Acquire(context.Background(), backends.AcquireRequest{Key: "test:k", Owner: "crashed", LeaseTTL: 50 * time.Millisecond, Retention: time.Hour})
	require.NoError(t, err)
	_, err = m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(newMsg("k", ""))
	require.NoError(t, err, "the holder's lease ran out during the wait")
	require.EqualValues(t, 1, counters.Takeovers())
}
