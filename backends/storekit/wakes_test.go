package storekit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Wake wakes the key's watches and no other; a stopped watch is never
// woken; a watch woken alone leaves the others; WakeAll wakes every one;
// stopping or waking a watch twice, or after it was woken, does nothing.
func TestWakes(t *testing.T) {
	var r storekit.Wakes // the zero value is ready
	a1, a2, b := r.Add("a"), r.Add("a"), r.Add("b")
	stopped := r.Add("a")
	stopped.Stop()
	r.Wake("a")
	require.True(t, closed(a1.Changed()))
	require.True(t, closed(a2.Changed()))
	require.False(t, closed(b.Changed()), "another key's watch")
	require.False(t, closed(stopped.Changed()), "a stopped watch is not woken")
	a1.Stop()
	a1.Wake()
	r.Wake("a") // nothing left to wake
	stopped.Wake()
	require.False(t, closed(stopped.Changed()), "nor woken alone once stopped")

	alone, other := r.Add("c"), r.Add("c")
	alone.Wake()
	require.True(t, closed(alone.Changed()))
	require.False(t, closed(other.Changed()))
	alone.Wake()

	r.WakeAll()
	require.True(t, closed(b.Changed()))
	require.True(t, closed(other.Changed()))
	r.WakeAll()
	late := r.Add("b")
	require.False(t, closed(late.Changed()), "a watch added after WakeAll waits")
	r.Wake("b")
	require.True(t, closed(late.Changed()))
}

// Many goroutines add, stop and wake watches of a few keys at once: no
// watch is closed twice (that would panic), and every watch not stopped
// is woken by the end, by the goroutines or by a last Wake of its key.
func TestWakesConcurrently(t *testing.T) {
	const (
		adders   = 32
		perAdder = 500
		keys     = 8
		wakers   = 8
	)
	var r storekit.Wakes
	type added struct {
		w       *storekit.Watch
		stopped bool
	}
	results := make([][]added, adders)
	var wakes atomic.Int64
	done := make(chan struct{})
	var wakersWG sync.WaitGroup
	for i := range wakers {
		wakersWG.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				default:
				}
				if i == 0 && n%50 == 0 {
					r.WakeAll()
				} else {
					r.Wake(fmt.Sprint(rand.IntN(keys)))
				}
				wakes.Add(1)
			}
		})
	}
	var addersWG sync.WaitGroup
	for i := range adders {
		addersWG.Go(func() {
			for n := range perAdder {
				w := r.Add(fmt.Sprint((i + n) % keys))
				a := added{w: w}
				switch rand.IntN(3) {
				case 0:
					a.stopped = true
					w.Stop()
				case 1:
					w.Wake()
				}
				results[i] = append(results[i], a)
			}
		})
	}
	addersWG.Wait()
	close(done)
	wakersWG.Wait()
	require.Positive(t, wakes.Load())
	for k := range keys {
		r.Wake(fmt.Sprint(k))
	}
	for _, rs := range results {
		for _, a := range rs {
			if a.stopped {
				continue // it may have been woken before its Stop, or not
			}
			require.True(t, closed(a.w.Changed()), "a watch never woken")
		}
	}
}

// WatchOf forwards a Watcher's watch, and reports not ok, with a stop to
// call, for a store without one.
func TestWatchOf(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	require.NoError(t, err)
	changed, stop, ok := storekit.WatchOf(context.Background(), store, "absent")
	require.True(t, ok)
	require.True(t, closed(changed), "nothing to wait for")
	stop()

	changed, stop, ok = storekit.WatchOf(context.Background(), struct{ backends.Store }{store}, "absent")
	require.False(t, ok)
	require.Nil(t, changed)
	stop()
}
