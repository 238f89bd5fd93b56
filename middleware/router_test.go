package middleware_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/keyfunc"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// These tests run the middleware in a real Watermill router on GoChannel,
// whose nack redelivers the message at once.

func TestRouterCompletedDuplicatesDropped(t *testing.T) {
	m, counters := newMiddleware(t, newMemstore(), func(c *middleware.Config) { c.Namespace = "" })
	var runs atomic.Int32
	env := newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		r.AddMiddleware(m.Middleware)
		r.AddConsumerHandler("orders", "in", ps, func(msg *message.Message) error {
			runs.Add(1)
			return nil
		})
	})
	// One copy at a time, each once the one before it settled: every
	// copy after the first finds the key completed.
	for i := range 5 {
		env.publish(t, "in", newMsg("same-uuid", "x"))
		waitFor(t, "delivery settled", func() bool { return total(counters) == int64(i+1) })
	}
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessed))
	require.EqualValues(t, 4, counters.Count(middleware.OutcomeDuplicate))
	require.Zero(t, counters.Waited(), "no copy found the key in progress")
}

// Many copies of one message arrive at once; the router runs each in its
// own goroutine. The handler body must run once, and the message must be
// processed exactly once with every copy acked in the end.
func TestRouterConcurrentDuplicatesRunOnce(t *testing.T) {
	const copies = 20
	m, counters := newMiddleware(t, newMemstore(), nil)
	var runs atomic.Int32
	release := make(chan struct{})
	env := newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		r.AddConsumerHandler("h", "in", ps, func(msg *message.Message) error {
			runs.Add(1)
			<-release
			return nil
		}).AddMiddleware(m.Middleware)
	})
	for range copies {
		env.publish(t, "in", newMsg("dup", "x"))
	}
	waitFor(t, "the body started", func() bool { return runs.Load() == 1 })
	time.Sleep(50 * time.Millisecond) // let the copies pile up behind the lease
	require.Zero(t, counters.Count(middleware.OutcomeDuplicate), "nothing is acked while the body runs")
	close(release)
	waitFor(t, "every copy settled", func() bool { return total(counters) == copies })
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessed))
	require.EqualValues(t, copies-1, counters.Count(middleware.OutcomeDuplicate))
	require.EqualValues(t, copies-1, counters.Waited())
}

// The regression test for the bug this library exists to not have: a
// handler fails once; the redelivery must be processed.
func TestRouterFailedMessageIsRetried(t *testing.T) {
	m, counters := newMiddleware(t, newMemstore(), nil)
	var attempts, successes atomic.Int32
	env := newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		r.AddConsumerHandler("h", "in", ps, func(msg *message.Message) error {
			if attempts.Add(1) == 1 {
				return errBoom
			}
			successes.Add(1)
			return nil
		}).AddMiddleware(m.Middleware)
	})
	env.publish(t, "in", newMsg("m1", "x"))
	waitFor(t, "processed", func() bool { return counters.Count(middleware.OutcomeProcessed) == 1 })
	require.EqualValues(t, 2, attempts.Load())
	require.EqualValues(t, 1, successes.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeHandlerFailed))
}

// The same scenario under Watermill's built-in Deduplicator, which keeps the
// key after the handler's error: the redelivery is dropped and the message
// is lost. If Watermill ever fixes this, this test will say so.
func TestWatermillDeduplicatorDropsTheRetry(t *testing.T) {
	var attempts, successes atomic.Int32
	var acked atomic.Int32
	dedup := &wmiddleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}
	env := newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		r.AddConsumerHandler("h", "in", ps, func(msg *message.Message) error {
			if attempts.Add(1) == 1 {
				return errBoom
			}
			successes.Add(1)
			return nil
		}).AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				if err == nil {
					acked.Add(1)
				}
				return out, err
			}
		}, dedup.Middleware)
	})
	env.publish(t, "in", newMsg("m1", "x"))
	waitFor(t, "the redelivery was acked", func() bool { return acked.Load() == 1 })
	require.EqualValues(t, 1, attempts.Load(), "the handler never ran again")
	require.EqualValues(t, 0, successes.Load(), "the message was lost")
}

func TestRouterPanicReleasesLease(t *testing.T) {
	store := newMemstore()
	m, counters := newMiddleware(t, store, nil)
	var attempts atomic.Int32
	env := newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		r.AddConsumerHandler("h", "in", ps, func(msg *message.Message) error {
			if attempts.Add(1) == 1 {
				panic("handler bug")
			}
			return nil
		}).AddMiddleware(m.Middleware)
	})
	env.publish(t, "in", newMsg("m1", "x"))
	waitFor(t, "processed after the panic", func() bool { return counters.Count(middleware.OutcomeProcessed) == 1 })
	require.EqualValues(t, 2, attempts.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeHandlerFailed))
	rec, err := store.Inspect(context.Background(), "test:m1")
	require.NoError(t, err)
	require.Equal(t, 2, rec.Attempt, "the panicked attempt released its lease; the retry acquired it at once")
}

// failingPublisher fails its first n Publish calls.
type failingPublisher struct {
	message.Publisher
	failures atomic.Int32
}

func (p *failingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.failures.Add(-1) >= 0 {
		return errors.New("broker unavailable")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// The router publishes a handler's output after the middleware returns. If
// that publish fails, the message is nacked; the redelivery finds the key
// completed and replays the stored output. The side effect ran once and
// the output is delivered.
func TestRouterOutputReplayedWhenFirstPublishFails(t *testing.T) {
	m, counters := newMiddleware(t, newMemstore(), nil)
	var sideEffects atomic.Int32
	env := newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		pub := &failingPublisher{Publisher: ps}
		pub.failures.Store(2)
		r.AddHandler("h", "in", ps, "out", pub, func(msg *message.Message) ([]*message.Message, error) {
			sideEffects.Add(1)
			out := message.NewMessage("out-"+msg.UUID, []byte("charged:"+string(msg.Payload)))
			out.Metadata.Set("order", "o-1")
			return []*message.Message{out, message.NewMessage("audit-"+msg.UUID, nil)}, nil
		}).AddMiddleware(m.Middleware)
	})
	received := env.collect(t, "out")
	env.publish(t, "in", newMsg("m1", "42"))

	waitFor(t, "output delivered", func() bool { return len(received()) == 2 })
	got := map[string]*message.Message{}
	for _, m := range received() {
		got[m.UUID] = m
	}
	require.Contains(t, got, "out-m1")
	require.Contains(t, got, "audit-m1")
	require.Equal(t, "charged:42", string(got["out-m1"].Payload))
	require.Equal(t, "o-1", got["out-m1"].Metadata.Get("order"))
	require.EqualValues(t, 1, sideEffects.Load(), "the handler ran once")
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessed))
	require.EqualValues(t, 2, counters.Count(middleware.OutcomeDuplicate), "two redeliveries replayed the output")
}

func TestRouterTwoHandlersOneTopicEachRunOnce(t *testing.T) {
	m, counters := newMiddleware(t, newMemstore(), func(c *middleware.Config) { c.Namespace = "" })
	var billing, shipping atomic.Int32
	env := newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		r.AddMiddleware(m.Middleware)
		r.AddConsumerHandler("billing", "orders", ps, func(*message.Message) error { billing.Add(1); return nil })
		r.AddConsumerHandler("shipping", "orders", ps, func(*message.Message) error { shipping.Add(1); return nil })
	})
	for range 3 {
		env.publish(t, "orders", newMsg("order-1", "x"))
	}
	waitFor(t, "every delivery settled", func() bool { return total(counters) == 6 })
	require.EqualValues(t, 1, billing.Load())
	require.EqualValues(t, 1, shipping.Load())
	require.EqualValues(t, 2, counters.Count(middleware.OutcomeProcessed))
	require.EqualValues(t, 4, counters.Count(middleware.OutcomeDuplicate))
}

// A message without a key is rejected with a typed error that Watermill's
// PoisonQueueWithFilter routes with IsPoison; nothing is dropped silently.
func TestRouterKeyErrorsGoToPoisonQueue(t *testing.T) {
	m, counters := newMiddleware(t, newMemstore(), func(c *middleware.Config) {
		c.Key = keyfunc.JSONField("order_id")
	})
	var runs atomic.Int32
	env := newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		poison, err := wmiddleware.PoisonQueueWithFilter(ps, "poison", middleware.IsPoison)
		require.NoError(t, err)
		r.AddConsumerHandler("h", "in", ps, func(*message.Message) error { runs.Add(1); return nil }).
			AddMiddleware(poison, m.Middleware)
	})
	poisoned := env.collect(t, "poison")
	env.publish(t, "in", newMsg("good", `{"order_id":"o-1"}`), newMsg("no-field", `{"other":1}`), newMsg("bad-json", `{"order_id":`))

	waitFor(t, "two poisoned", func() bool { return len(poisoned()) == 2 })
	waitFor(t, "one processed", func() bool { return counters.Count(middleware.OutcomeProcessed) == 1 })
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 2, counters.Count(middleware.OutcomeKeyError))
	reasons := map[string]string{}
	for _, p := range poisoned() {
		reasons[p.UUID] = p.Metadata.Get(wmiddleware.ReasonForPoisonedKey)
	}
	require.Contains(t, reasons["no-field"], "missing")
	require.Contains(t, reasons["bad-json"], "not valid JSON")
}

// An in-flight duplicate on GoChannel is nacked after the bounded wait and
// redelivered at once; the wait is what keeps that loop from hammering the
// store. Each redelivery waits its full budget, so the number of store
// calls per unit of time stays small.
func TestRouterInProgressDuplicateDoesNotSpinTheStore(t *testing.T) {
	store := &faultStore{Store: newMemstore()}
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.Timing.InProgressWait = 100 * time.Millisecond
		c.Timing.Poll.Initial = 20 * time.Millisecond
		c.Timing.Poll.Max = 50 * time.Millisecond
	})
	release := make(chan struct{})
	var runs atomic.Int32
	env := newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		r.AddConsumerHandler("h", "in", ps, func(msg *message.Message) error {
			runs.Add(1)
			<-release
			return nil
		}).AddMiddleware(m.Middleware)
	})
	env.publish(t, "in", newMsg("slow", "x"))
	waitFor(t, "holder running", func() bool { return runs.Load() == 1 })
	before := store.acquires.Load()
	env.publish(t, "in", newMsg("slow", "x"))
	time.Sleep(time.Second)
	calls := store.acquires.Load() - before
	close(release)
	waitFor(t, "duplicate acked after the holder completed", func() bool { return counters.Count(middleware.OutcomeDuplicate) == 1 })

	// With a 100ms budget polled at 20/40/50ms, each redelivery makes at
	// most 5 store calls; over one second, at most ~11 redeliveries. A hot
	// nack loop would make tens of thousands.
	require.Less(t, calls, int64(80), "store calls in one second of contention")
	require.Positive(t, counters.Count(middleware.OutcomeInProgress), "the duplicate was nacked, never acked, while the holder ran")
	require.EqualValues(t, 1, runs.Load())
}

func TestOutcomesAckedMatchesRouterBehaviour(t *testing.T) {
	for _, o := range middleware.Outcomes() {
		require.NotContains(t, o.String(), "Outcome(", "every outcome has a name")
	}
	require.True(t, middleware.OutcomeDuplicate.Acked())
	require.False(t, middleware.OutcomeInProgress.Acked(), "an in-flight duplicate is never acked")
}

// The chain the configuration guide recommends: a poison queue filtered by
// IsPoison outermost, then idempotency, then Retry. Retries run under one
// lease; a key error goes to the poison queue without being retried.
func TestRouterRecommendedChainWithRetryAndPoisonQueue(t *testing.T) {
	m, counters := newMiddleware(t, newMemstore(), func(c *middleware.Config) {
		c.Key = keyfunc.Metadata("order")
	})
	var attempts atomic.Int32
	var tokens sync.Map
	env := newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		poison, err := wmiddleware.PoisonQueueWithFilter(ps, "poison", middleware.IsPoison)
		require.NoError(t, err)
		retry := wmiddleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond}
		r.AddConsumerHandler("h", "in", ps, func(msg *message.Message) error {
			lease, _ := middleware.LeaseFromContext(msg.Context())
			tokens.Store(lease.Token, true)
			if attempts.Add(1) < 3 {
				return errBoom
			}
			return nil
		}).AddMiddleware(poison, m.Middleware, retry.Middleware)
	})
	poisoned := env.collect(t, "poison")
	good := newMsg("m1", "x")
	good.Metadata.Set("order", "o-1")
	env.publish(t, "in", good, newMsg("no-key", "x"))

	waitFor(t, "processed", func() bool { return counters.Count(middleware.OutcomeProcessed) == 1 })
	waitFor(t, "poisoned", func() bool { return len(poisoned()) == 1 })
	require.EqualValues(t, 3, attempts.Load(), "two retries, then success")
	n := 0
	tokens.Range(func(any, any) bool { n++; return true })
	require.Equal(t, 1, n, "every retry ran under the same lease")
	require.Equal(t, "no-key", poisoned()[0].UUID)
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeKeyError), "the key error was not retried")
	require.Zero(t, counters.Count(middleware.OutcomeHandlerFailed))
}
