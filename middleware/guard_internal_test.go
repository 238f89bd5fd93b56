package middleware

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var errDown = errors.New("down")

// Failures of calls that were in flight together count as one round;
// a later failure counts as another; a success ends the probing.
func TestGuardCountsRounds(t *testing.T) {
	g := newGuard(8, Backoff{Initial: DefaultStoreBackoffInitial, Max: time.Second})
	ctx := context.Background()
	var tickets []ticket
	for range 5 {
		tk, err := g.admit(ctx)
		require.NoError(t, err)
		require.False(t, tk.probe)
		tickets = append(tickets, tk)
	}
	for _, tk := range tickets {
		g.record(tk, errDown)
	}
	require.Equal(t, 1, g.failures, "five calls in flight together are one round")

	tk, err := g.admit(ctx) // waits for its turn, about 10ms
	require.NoError(t, err)
	require.True(t, tk.probe)
	g.record(tk, errDown)
	require.Equal(t, 2, g.failures)
	require.Equal(t, 20*time.Millisecond, g.backoffLocked())

	tk, err = g.admit(ctx)
	require.NoError(t, err)
	g.record(tk, nil)
	require.Zero(t, g.failures)
	tk, err = g.admit(ctx)
	require.NoError(t, err)
	require.False(t, tk.probe, "no probing once the store answers")
}

// While the store fails, however many callers wait, one probe is in
// flight at a time.
func TestGuardOneProbeAtATime(t *testing.T) {
	g := newGuard(64, Backoff{Initial: DefaultStoreBackoffInitial, Max: 20 * time.Millisecond})
	tk, _ := g.admit(context.Background())
	g.record(tk, errDown)

	var inFlight, most, calls atomic.Int32
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			for ctx.Err() == nil {
				tk, err := g.admit(ctx)
				if err != nil {
					require.ErrorIs(t, err, errBackingOff)
					return
				}
				n := inFlight.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				calls.Add(1)
				time.Sleep(time.Millisecond)
				inFlight.Add(-1)
				g.record(tk, errDown)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, most.Load(), "one probe at a time")
	require.Positive(t, calls.Load())
}

// A caller whose deadline comes before its turn is told at once.
func TestGuardBackingOffBeforeDeadline(t *testing.T) {
	g := newGuard(1, Backoff{Initial: DefaultStoreBackoffInitial, Max: time.Minute})
	for range 20 {
		tk, err := g.admit(context.Background())
		require.NoError(t, err)
		g.record(tk, errDown)
		g.next = time.Time{} // skip the wait; keep the count
	}
	g.next = time.Now().Add(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err := g.admit(ctx)
	require.ErrorIs(t, err, errBackingOff)
	require.ErrorIs(t, err, errDown)
	require.Less(t, time.Since(start), 30*time.Second, "without waiting for the deadline")
	require.Equal(t, time.Minute, g.backoffLocked(), "capped at StoreBackoff.Max")
}

func TestGuardPauseWithinBounds(t *testing.T) {
	g := newGuard(1, Backoff{Initial: DefaultStoreBackoffInitial, Max: 2 * time.Second})
	for range 100 {
		p := g.pause()
		require.GreaterOrEqual(t, p, time.Second)
		require.LessOrEqual(t, p, 2*time.Second)
	}
}
