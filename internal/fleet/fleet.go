// Package fleet runs several Watermill routers, each with its own
// GoChannel, as separate service instances would be, for tests that
// deliver the same work to many consumers at once.
package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-idempotency/idempotency/middleware"
)

// Topic is the topic every instance consumes.
const Topic = "in"

// Fleet is a set of running instances.
type Fleet struct {
	pubs     []*gochannel.GoChannel
	counters []*middleware.Counters
}

// Start starts n instances. newHandler builds instance i's handler, given
// the counters to use as its middleware's Observer. Everything stops when
// the test ends.
func Start(t testing.TB, n int, newHandler func(i int, counters *middleware.Counters) message.NoPublishHandlerFunc) *Fleet {
	t.Helper()
	f := &Fleet{}
	for i := range n {
		counters := &middleware.Counters{}
		logger := watermill.NopLogger{}
		ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 256}, logger)
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
		if err != nil {
			t.Fatal(err)
		}
		r.AddConsumerHandler("h", Topic, ps, newHandler(i, counters))
		go func() { _ = r.Run(context.Background()) }()
		<-r.Running()
		t.Cleanup(func() { _ = r.Close(); _ = ps.Close() })
		f.pubs = append(f.pubs, ps)
		f.counters = append(f.counters, counters)
	}
	return f
}

// PublishCopies publishes copies deliveries of each of keys units of work,
// all at once: copy c of key k goes to instance (k+c) mod n under a new
// message UUID, as a producer retry would, with payload(k) as payload.
func (f *Fleet) PublishCopies(t testing.TB, keys, copies int, payload func(k int) []byte) {
	t.Helper()
	var wg sync.WaitGroup
	for c := range copies {
		wg.Go(func() {
			for k := range keys {
				msg := message.NewMessage(watermill.NewUUID(), payload(k))
				if err := f.pubs[(k+c)%len(f.pubs)].Publish(Topic, msg); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// Count sums the given outcomes over every instance.
func (f *Fleet) Count(outcomes ...middleware.Outcome) (n int64) {
	for _, c := range f.counters {
		for _, o := range outcomes {
			n += c.Count(o)
		}
	}
	return n
}

// Acked counts the deliveries whose outcome acked the message.
func (f *Fleet) Acked() (n int64) {
	for _, o := range middleware.Outcomes() {
		if o.Acked() {
			n += f.Count(o)
		}
	}
	return n
}

// Outcomes returns every non-zero outcome count, summed over the fleet.
func (f *Fleet) Outcomes() map[string]int64 {
	m := map[string]int64{}
	for _, o := range middleware.Outcomes() {
		if n := f.Count(o); n != 0 {
			m[o.String()] = n
		}
	}
	return m
}

// WaitAcked waits until n deliveries were acked, failing the test after
// timeout with the outcomes seen.
func (f *Fleet) WaitAcked(t testing.TB, n int64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := f.Acked()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleet: %d of %d deliveries acked after %v; outcomes: %v", got, n, timeout, f.Outcomes())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
