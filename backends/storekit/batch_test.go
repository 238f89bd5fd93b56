package storekit_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

type batchCall struct {
	n    int
	sent int // times a batch carried it
}

// Every call is sent exactly once, at most inFlight batches fly at once,
// none holds more than size calls, and calls that meet go together.
func TestBatcherSendsEveryCallOnce(t *testing.T) {
	const callers, each, inFlight, size = 32, 200, 2, 8
	var flying, most, batched atomic.Int64
	b := storekit.NewBatcher(inFlight, size, func(calls []*batchCall) {
		n := flying.Add(1)
		defer flying.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		assert.LessOrEqual(t, len(calls), size)
		if len(calls) > 1 {
			batched.Add(1)
		}
		for _, c := range calls {
			c.sent++
		}
		time.Sleep(50 * time.Microsecond)
	})
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for i := range each {
				c := &batchCall{n: g*each + i}
				if assert.NoError(t, b.Do(context.Background(), c)) {
					assert.Equal(t, 1, c.sent, "call %d", c.n)
				}
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, most.Load(), int64(inFlight))
	assert.Positive(t, batched.Load(), "no calls met in a batch")
	assert.Zero(t, b.Queued())
}

// A call whose context ends while it waits in the queue leaves it unsent;
// the others are sent, in batches of at most size.
func TestBatcherCallCancelledWhileQueued(t *testing.T) {
	release := make(chan struct{})
	var sizes []int
	var mu sync.Mutex
	b := storekit.NewBatcher(1, 2, func(calls []*batchCall) {
		mu.Lock()
		sizes = append(sizes, len(calls))
		mu.Unlock()
		for _, c := range calls {
			c.sent++
		}
		if calls[0].n == 0 {
			<-release
		}
	})
	first := &batchCall{n: 0}
	done := make(chan error, 1)
	go func() { done <- b.Do(context.Background(), first) }()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(sizes) == 1 }, time.Minute, time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	gone := &batchCall{n: 1}
	goneErr := make(chan error, 1)
	go func() { goneErr <- b.Do(ctx, gone) }()
	var wg sync.WaitGroup
	rest := []*batchCall{{n: 2}, {n: 3}, {n: 4}}
	for _, c := range rest {
		wg.Go(func() { assert.NoError(t, b.Do(context.Background(), c)) })
	}
	require.Eventually(t, func() bool { return b.Queued() == 4 }, time.Minute, time.Millisecond)
	cancel()
	assert.ErrorIs(t, <-goneErr, context.Canceled)
	assert.Equal(t, 3, b.Queued())
	close(release)
	require.NoError(t, <-done)
	wg.Wait()
	assert.Zero(t, gone.sent)
	for _, c := range append(rest, first) {
		assert.Equal(t, 1, c.sent, "call %d", c.n)
	}
	assert.Equal(t, []int{1, 2, 1}, sizes)
}

func TestBatchContext(t *testing.T) {
	base := context.Background()
	early, c1 := context.WithTimeout(base, time.Minute)
	defer c1()
	late, c2 := context.WithTimeout(base, time.Hour)
	defer c2()
	cancelled, c3 := context.WithCancel(late)
	c3()

	ctx, cancel := storekit.BatchContext(early, cancelled)
	d, ok := ctx.Deadline()
	lateD, _ := late.Deadline()
	assert.True(t, ok)
	assert.Equal(t, lateD, d, "the latest deadline")
	assert.NoError(t, ctx.Err(), "a caller's cancellation ends no batch")
	cancel()
	assert.Error(t, ctx.Err())

	ctx, cancel = storekit.BatchContext(early, base)
	defer cancel()
	_, ok = ctx.Deadline()
	assert.False(t, ok, "a call without a deadline: none")
}
