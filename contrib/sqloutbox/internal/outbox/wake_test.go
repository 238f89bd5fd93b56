package outbox

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

var nop = watermill.NopLogger{}

// returns runs f in a goroutine and fails the test unless it returns
// within a minute: f waits for something that must come.
func returns(t *testing.T, what string, f func() time.Duration) time.Duration {
	t.Helper()
	done := make(chan time.Duration, 1)
	go func() { done <- f() }()
	select {
	case d := <-done:
		return d
	case <-time.After(time.Minute):
		t.Fatalf("%s: still waiting after a minute", what)
		return 0
	}
}

// The subscriber's wait after an empty read ends with a wake, or with a
// wake that came during the read, with the subscription's end, and at
// once after a read that found rows: never at the poll interval (an hour
// here).
func TestWakerWaits(t *testing.T) {
	w := newWaker(time.Hour)
	started := make(chan struct{})
	var d time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		close(started)
		d = w.HandleError(nop, true, nil)
	})
	<-started
	// The wake may come before the wait begins: it is kept.
	w.Wake()
	returns(t, "woken wait", func() time.Duration { wg.Wait(); return d })
	if d != 0 {
		t.Errorf("after a wake: wait %v more, want 0", d)
	}

	w.Wake() // during a read
	w.Wake() // coalesced with the first
	if got := returns(t, "wait after a wake during the read", func() time.Duration { return w.HandleError(nop, true, nil) }); got != 0 {
		t.Errorf("got %v, want 0", got)
	}
	if got := w.HandleError(nop, false, nil); got != 0 {
		t.Errorf("after a read that found rows: wait %v, want 0", got)
	}

	// The quick retries after activity: 1, 2 ... 64 ms, then the poll
	// interval.
	for want := firstRetry; want <= lastRetry; want *= 2 {
		if w.retry != want {
			t.Fatalf("next retry %v, want %v", w.retry, want)
		}
		returns(t, "quick retry", func() time.Duration { return w.HandleError(nop, true, nil) })
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		w.close()
	}()
	returns(t, "wait at the poll interval, ended by the subscription's end", func() time.Duration { return w.HandleError(nop, true, nil) })
	if w.retry != 0 {
		t.Errorf("after the quick retries: next retry %v, want 0 (the poll interval)", w.retry)
	}
	// Once ended, nothing waits.
	if got := returns(t, "ended", func() time.Duration { return w.HandleError(nop, true, errors.New("closed")) }); got != 0 {
		t.Errorf("after the end: wait %v, want 0", got)
	}
}

// An error is answered as watermill-sql answers it: a second's wait.
func TestWakerErrors(t *testing.T) {
	w := newWaker(time.Hour)
	if got := w.HandleError(nop, false, errors.New("connection refused")); got != time.Second {
		t.Errorf("after an error: wait %v, want 1s", got)
	}
}

// A commit wakes every Forwarder of its topic in the process, and only
// those.
func TestWakeReachesTheTopicsForwarders(t *testing.T) {
	db, otherDB := new(int), new(int)
	o, err := New(nil, db, Config{Topic: "wake_test"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.Forwarding() {
		t.Error("Forwarding before any Forwarder runs")
	}
	a, b, other, otherDBs := newWaker(time.Hour), newWaker(time.Hour), newWaker(time.Hour), newWaker(time.Hour)
	ua, ub := register(o.key, a), register(newWakeKey(db, "wake_test"), b)
	defer register(newWakeKey(db, "wake_test_other"), other)()
	defer register(newWakeKey(otherDB, "wake_test"), otherDBs)()
	if !o.Forwarding() {
		t.Error("not Forwarding while two Forwarders run")
	}
	o.Wake()
	for name, w := range map[string]*waker{"a": a, "b": b} {
		select {
		case <-w.wake:
		default:
			t.Errorf("%s was not woken", name)
		}
	}
	for name, w := range map[string]*waker{"another topic's": other, "another database's": otherDBs} {
		select {
		case <-w.wake:
			t.Errorf("%s Forwarder was woken", name)
		default:
		}
	}
	ua()
	ub()
	if o.Forwarding() {
		t.Error("Forwarding after its Forwarders ended")
	}
	wakers.Lock()
	defer wakers.Unlock()
	if _, ok := wakers.m[o.key]; ok {
		t.Error("the outbox is still registered after its Forwarders ended")
	}
}
