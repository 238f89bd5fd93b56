package middleware_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// New deliveries whose Acquire calls hang take at most
// MaxConcurrentAcquires calls in flight; the others queue. Meanwhile a
// running handler's lease is renewed and its completion recorded: lease
// keeping never waits behind new work.
func TestAcquiresBoundedLeaseKeepingNot(t *testing.T) {
	unblock := make(chan struct{})
	store := &faultStore{Store: newMemstore(),
		holdAcquire: func(key string) <-chan struct{} {
			if strings.HasPrefix(key, "test:slow-") {
				return unblock
			}
			return nil
		}}
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.LeaseTTL = 300 * time.Millisecond
		c.MaxConcurrentAcquires = 2
	})
	finish := make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { <-finish; return nil, nil })(newMsg("held", "x"))
		held <- err
	}()
	waitFor(t, "the holder running", func() bool { return store.acquires.Load() == 1 })

	const slow = 20
	var wg sync.WaitGroup
	for i := range slow {
		wg.Go(func() {
			_, err := m.Middleware(ok)(newMsg(fmt.Sprintf("slow-%d", i), "x"))
			if err != nil {
				t.Error(err)
			}
		})
	}
	waitFor(t, "two acquires hanging", func() bool { return store.inAcquire.Load() == 2 })
	renews := store.renews.Load()
	waitFor(t, "renewals go on", func() bool { return store.renews.Load() >= renews+3 })
	close(finish)
	require.NoError(t, <-held, "the holder's completion went through")
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessed))
	require.EqualValues(t, 2+1, store.acquires.Load(), "the other new deliveries wait for a slot, not in the store")

	close(unblock)
	wg.Wait()
	require.EqualValues(t, 2, store.maxInAcquire.Load())
	require.EqualValues(t, 1+slow, counters.Count(middleware.OutcomeProcessed))
}

// An error the store says retrying cannot fix fails the delivery at once:
// one call, not retries until StoreTimeout.
func TestPermanentAcquireErrorFailsAtOnce(t *testing.T) {
	store := &faultStore{Store: newMemstore(),
		acquireErr: fmt.Errorf("%w: relation \"idempotency_keys\" does not exist", backends.ErrRejected)}
	m, counters := newMiddleware(t, store, func(c *middleware.Config) { c.Timing.StoreTimeout = time.Minute })
	_, err := m.Middleware(ok)(newMsg("k", "x"))
	require.ErrorIs(t, err, middleware.ErrStore)
	require.ErrorIs(t, err, backends.ErrRejected)
	require.EqualValues(t, 1, store.acquires.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeStoreError))
}

// A delivery that failed on the store waits half to all of StoreBackoff.Max
// before it is nacked.
func TestStoreErrorPausesBeforeNack(t *testing.T) {
	store := &faultStore{Store: newMemstore(),
		acquireErr: fmt.Errorf("%w: permission denied", backends.ErrRejected)}
	m, _ := newMiddleware(t, store, func(c *middleware.Config) { c.Timing.StoreBackoff.Max = 400 * time.Millisecond })
	start := time.Now()
	_, err := m.Middleware(ok)(newMsg("k", "x"))
	require.ErrorIs(t, err, middleware.ErrStore)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
}

// During a store outage, deliveries on GoChannel (whose nack redelivers at
// once) keep coming back, yet the store sees a trickle of calls: the
// acquisitions are spaced out, however many deliveries wait, and each
// failed delivery pauses before its nack. When the store is back, every
// message is processed.
func TestStoreOutageCallsBounded(t *testing.T) {
	const messages = 50
	const outage = 2 * time.Second
	store := &faultStore{Store: newMemstore(), acquireErr: errors.New("connection refused")}
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.Timing.StoreBackoff.Max = 200 * time.Millisecond
		c.Timing.StoreTimeout = 500 * time.Millisecond
	})
	var processed atomic.Int32
	env := newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		r.AddConsumerHandler("h", "in", ps, func(*message.Message) error { processed.Add(1); return nil }).AddMiddleware(m.Middleware)
	})
	for i := range messages {
		env.publish(t, "in", newMsg(fmt.Sprintf("m%d", i), "x"))
	}
	time.Sleep(outage)
	calls := store.acquires.Load()
	nacks := counters.Count(middleware.OutcomeStoreError)
	store.set(func(f *faultStore) { f.acquireErr = nil })
	waitFor(t, "every message processed after the outage", func() bool { return processed.Load() == messages })

	// The first calls fail together (at most MaxConcurrentAcquires of
	// them, one round); then one probe at a time goes out, after pauses of
	// 10, 20, 40, 80, 160, then 200ms (±20%): about 14 calls in a 2s
	// outage. Without the guard, each of the 50 deliveries would retry on
	// its own every few milliseconds.
	t.Logf("%d messages, %v outage: %d store calls (%.1f/s), %d store-error nacks",
		messages, outage, calls, float64(calls)/outage.Seconds(), nacks)
	require.LessOrEqual(t, calls, int64(middleware.DefaultMaxConcurrentAcquires+5+int(outage/(160*time.Millisecond))))
	require.Positive(t, nacks)
}

// pooled is a store that reports a pool size.
type pooled struct {
	*faultStore
	size int
}

func (p pooled) PoolSize() int { return p.size }

// Without MaxConcurrentAcquires, a store that reports its pool size gets
// at most half of it taken by acquisitions.
func TestDefaultBoundIsHalfTheStorePool(t *testing.T) {
	unblock := make(chan struct{})
	store := &faultStore{Store: newMemstore(),
		holdAcquire: func(string) <-chan struct{} { return unblock }}
	m, counters := newMiddleware(t, pooled{faultStore: store, size: 6}, nil)
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() { _, _ = m.Middleware(ok)(newMsg(fmt.Sprint(i), "x")) })
	}
	waitFor(t, "three acquires hanging", func() bool { return store.inAcquire.Load() == 3 })
	time.Sleep(50 * time.Millisecond) // room for a fourth, if the bound were wrong
	require.EqualValues(t, 3, store.acquires.Load())
	close(unblock)
	wg.Wait()
	require.EqualValues(t, 3, store.maxInAcquire.Load())
	require.EqualValues(t, 10, counters.Count(middleware.OutcomeProcessed))
}
