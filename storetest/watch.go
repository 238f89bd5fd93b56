package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
)

// watchTests run for stores that implement [backends.Watcher]. A watch may
// be woken without a change, so the suite checks only that every change
// wakes it.
var watchTests = []struct {
	name string
	fn   func(t *testing.T, s *suite, w backends.Watcher)
}{
	{"WatchWokenByComplete", func(t *testing.T, s *suite, w backends.Watcher) {
		testWatchWoken(t, s, w, func(l backends.Lease) error { return s.Store.Complete(ctx(t), l, nil) })
	}},
	{"WatchWokenByRelease", func(t *testing.T, s *suite, w backends.Watcher) {
		testWatchWoken(t, s, w, func(l backends.Lease) error { return s.Store.Release(ctx(t), l) })
	}},
	{"WatchWokenByDelete", func(t *testing.T, s *suite, w backends.Watcher) {
		testWatchWoken(t, s, w, func(l backends.Lease) error { return s.Store.Delete(ctx(t), l.Key) })
	}},
	{"WatchStorm", testWatchStorm},
	{"WatchOfKeyNotHeld", testWatchOfKeyNotHeld},
}

// wakeWait bounds the wait for a wake: far above any store's round trip,
// so that only a missing notification fails it.
const wakeWait = 30 * time.Second

// testWatchWoken checks that change, done by another owner's lease on a
// watched key, wakes every watch of the key, and that a watch ended
// before it is not counted on.
func testWatchWoken(t *testing.T, s *suite, w backends.Watcher, change func(backends.Lease) error) {
	key := s.key("k")
	l := s.mustAcquire(t, key, s.owner(), long)
	first, stop1, ok := w.Watch(ctx(t), key)
	require.True(t, ok, "a healthy store can watch")
	defer stop1()
	second, stop2, ok := w.Watch(ctx(t), key)
	require.True(t, ok)
	defer stop2()
	_, stopped, _ := w.Watch(ctx(t), key)
	stopped() // ended: the change must not trip over it
	require.NoError(t, change(l))
	for i, ch := range []<-chan struct{}{first, second} {
		select {
		case <-ch:
		case <-time.After(wakeWait):
			t.Fatalf("watch %d was not woken within %v", i+1, wakeWait)
		}
	}
}

// testWatchStorm runs many watches of a few keys at once, through rounds
// in which every key is held, watched, and completed or released, while
// other goroutines start and stop watches of the same keys: every watch in
// place when its key changes is woken.
func testWatchStorm(t *testing.T, s *suite, w backends.Watcher) {
	const (
		keys     = 8
		watchers = 32
		churners = 8
		rounds   = 4
	)
	for round := range rounds {
		leases := make([]backends.Lease, keys)
		for k := range keys {
			leases[k] = s.mustAcquire(t, s.key(fmt.Sprintf("storm-%d-%d", round, k)), s.owner(), long)
		}
		var placed, churned sync.WaitGroup
		stopChurn := make(chan struct{})
		for c := range churners {
			churned.Add(1)
			go func() {
				defer churned.Done()
				for i := 0; ; i++ {
					select {
					case <-stopChurn:
						return
					default:
					}
					_, stop, _ := w.Watch(ctx(t), leases[(c+i)%keys].Key)
					stop()
				}
			}()
		}
		type watch struct {
			key     int
			changed <-chan struct{}
		}
		watches := make(chan watch, watchers)
		for i := range watchers {
			placed.Add(1)
			go func() {
				defer placed.Done()
				changed, stop, ok := w.Watch(ctx(t), leases[i%keys].Key)
				if !ok {
					t.Errorf("round %d: watch %d of key %d not ok on a healthy store", round, i, i%keys)
					return
				}
				t.Cleanup(stop)
				watches <- watch{i % keys, changed}
			}()
		}
		placed.Wait()
		close(watches)
		for k, l := range leases {
			if k%2 == 0 {
				require.NoError(t, s.Store.Complete(ctx(t), l, nil))
			} else {
				require.NoError(t, s.Store.Release(ctx(t), l))
			}
		}
		for wt := range watches {
			select {
			case <-wt.changed:
			case <-time.After(wakeWait):
				t.Fatalf("round %d: a watch of key %d was not woken within %v", round, wt.key, wakeWait)
			}
		}
		close(stopChurn)
		churned.Wait()
	}
}

// testWatchOfKeyNotHeld checks that a watch of a key that holds no live
// lease in progress when the watch is in place is woken by the time Watch
// returns: the caller counts on it instead of asking the store once more.
func testWatchOfKeyNotHeld(t *testing.T, s *suite, w backends.Watcher) {
	completed := s.key("completed")
	require.NoError(t, s.Store.Complete(ctx(t), s.mustAcquire(t, completed, s.owner(), long), nil))
	released := s.key("released")
	require.NoError(t, s.Store.Release(ctx(t), s.mustAcquire(t, released, s.owner(), long)))
	deleted := s.key("deleted")
	s.mustAcquire(t, deleted, s.owner(), long)
	require.NoError(t, s.Store.Delete(ctx(t), deleted))
	expired := s.key("expired")
	s.mustAcquire(t, expired, s.owner(), s.ticks(1))
	s.waitPast(2)
	require.Equal(t, backends.StateExpired, s.inspect(t, expired).State)

	for name, key := range map[string]string{
		"never acquired": s.key("absent"), "completed": completed, "released": released,
		"deleted": deleted, "expired": expired,
	} {
		changed, stop, ok := w.Watch(ctx(t), key)
		require.True(t, ok, "%s: a healthy store can watch", name)
		select {
		case <-changed:
		default:
			t.Errorf("%s: the watch was not woken by the time Watch returned", name)
		}
		stop()
	}
}
