package middleware

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Waits here only ever run late: a context asserted live has an hour left,
// and one asserted expired is looked at after its deadline.

func TestDeadlineCtxWithoutDone(t *testing.T) {
	live := withDeadline(context.Background(), time.Hour)
	defer live.stop()
	require.NoError(t, live.Err())

	before := time.Now()
	c := withDeadline(context.Background(), 20*time.Millisecond)
	after := time.Now()
	defer c.stop()
	d, ok := c.Deadline()
	require.True(t, ok)
	require.False(t, d.Before(before.Add(20*time.Millisecond)), "deadline %v, created at %v", d, before)
	require.False(t, d.After(after.Add(20*time.Millisecond)), "deadline %v, created by %v", d, after)
	time.Sleep(time.Until(d) + time.Millisecond)
	require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
	select {
	case <-c.Done():
	default:
		t.Fatal("Done must be closed once Err reported the deadline")
	}
}

func TestDeadlineCtxDoneClosesAtDeadline(t *testing.T) {
	live := withDeadline(context.Background(), time.Hour)
	defer live.stop()
	open := live.Done()
	require.NoError(t, live.Err(), "Err is nil while Done is open")
	select {
	case <-open:
		t.Fatal("Done closed an hour early")
	default:
	}

	c := withDeadline(context.Background(), 20*time.Millisecond)
	defer c.stop()
	done := c.Done()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Done never closed")
	}
	require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
	require.Equal(t, done, c.Done(), "the same channel every time")
}

func TestDeadlineCtxStopAndChildren(t *testing.T) {
	type key struct{}
	c := withDeadline(context.WithValue(context.Background(), key{}, "v"), time.Hour)
	require.Equal(t, "v", c.Value(key{}), "values come from the parent")
	child, cancel := context.WithCancel(c)
	cancel()
	require.ErrorIs(t, child.Err(), context.Canceled)
	require.NoError(t, c.Err(), "a child's cancel does not reach the parent")
	c.stop()
	require.NoError(t, c.Err())

	expired := withDeadline(context.Background(), -time.Second)
	require.ErrorIs(t, expired.Err(), context.DeadlineExceeded)
	sub, cancelSub := context.WithTimeout(expired, time.Hour)
	defer cancelSub()
	require.ErrorIs(t, sub.Err(), context.DeadlineExceeded, "children see the deadline")
}

// A client such as pgx watches the context of each call through
// context.AfterFunc; on this context that costs no goroutine.
func TestDeadlineCtxAfterFuncStartsNoGoroutine(t *testing.T) {
	c := withDeadline(context.Background(), time.Hour)
	defer c.stop()
	before := runtime.NumGoroutine()
	var stops []func() bool
	var cancels []context.CancelFunc
	for range 20 {
		stops = append(stops, context.AfterFunc(c, func() { t.Error("ran an hour early") }))
		_, cancel := context.WithCancel(c)
		cancels = append(cancels, cancel)
	}
	require.Less(t, runtime.NumGoroutine(), before+10, "a goroutine per watch")
	for _, stop := range stops {
		require.True(t, stop(), "stopped before the deadline")
		require.False(t, stop(), "stopped already")
	}
	for _, cancel := range cancels {
		cancel()
	}
	require.NoError(t, c.Err())
}

func TestDeadlineCtxAfterFuncRunsAtDeadline(t *testing.T) {
	c := withDeadline(context.Background(), 20*time.Millisecond)
	defer c.stop()
	errs := make(chan error, 1)
	stop := context.AfterFunc(c, func() { errs <- c.Err() })
	stopped := context.AfterFunc(c, func() { t.Error("ran after its stop") })
	require.True(t, stopped())
	child, cancel := context.WithCancel(c)
	defer cancel()
	select {
	case err := <-errs:
		require.ErrorIs(t, err, context.DeadlineExceeded, "f runs once the context is done")
	case <-time.After(5 * time.Second):
		t.Fatal("f never ran")
	}
	require.False(t, stop(), "f ran")
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a child's Done never closed")
	}
	require.ErrorIs(t, child.Err(), context.DeadlineExceeded)

	expired := withDeadline(context.Background(), -time.Second)
	ran := make(chan struct{})
	stop = context.AfterFunc(expired, func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("f never ran on an expired context")
	}
	require.False(t, stop())
}
