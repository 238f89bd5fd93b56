package middleware_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/keyfunc"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// eventSlot receives the event of the one delivery whose context carries it.
type eventSlot struct{ ev *middleware.Event }

type slotKey struct{}

// slotObserver records each event in the slot its delivery's context holds.
var slotObserver = middleware.ObserverFunc(func(ctx context.Context, ev middleware.Event) {
	if s, ok := ctx.Value(slotKey{}).(*eventSlot); ok {
		s.ev = &ev
	}
})

// deliver runs one message through m and returns its event and error.
func deliver(t *testing.T, m *middleware.Idempotency, msg *message.Message, h message.HandlerFunc) (middleware.Event, error) {
	t.Helper()
	slot := &eventSlot{}
	msg.SetContext(context.WithValue(msg.Context(), slotKey{}, slot))
	_, err := m.Middleware(h)(msg)
	require.NotNil(t, slot.ev, "the observer was told before the middleware returned")
	return *slot.ev, err
}

// Event.Acked says what the middleware returned to the router, for every
// kind of delivery, including unprotected ones whose fate is the handler's.
func TestEventAckedMatchesWhatTheRouterIsTold(t *testing.T) {
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	failing := func(*message.Message) ([]*message.Message, error) { return nil, errBoom }
	store := newMemstore()
	m, _ := newMiddleware(t, store, func(c *middleware.Config) {
		c.Observer = slotObserver
		c.Timing.InProgressWait = -1
	})
	unprotected, _ := newMiddleware(t, store, func(c *middleware.Config) {
		c.Observer = slotObserver
		c.Key = keyfunc.Metadata("k")
		c.OnKeyError = middleware.KeyErrorRunUnprotected
	})
	rejecting, _ := newMiddleware(t, store, func(c *middleware.Config) {
		c.Observer = slotObserver
		c.Key = keyfunc.Metadata("k")
	})
	down, _ := newMiddleware(t, &faultStore{Store: store, acquireErr: errors.New("connection refused")}, func(c *middleware.Config) {
		c.Observer = slotObserver
		c.Timing.StoreTimeout = 20 * time.Millisecond
	})

	held := make(chan struct{})
	holding := make(chan struct{})
	go func() {
		_, _ = m.Middleware(func(*message.Message) ([]*message.Message, error) {
			close(holding)
			<-held
			return nil, nil
		})(newMsg("held", "x"))
	}()
	<-holding
	defer close(held)

	for _, c := range []struct {
		name string
		m    *middleware.Idempotency
		uuid string
		h    message.HandlerFunc
		want middleware.Outcome
	}{
		{"processed", m, "a", ok, middleware.OutcomeProcessed},
		{"duplicate", m, "a", ok, middleware.OutcomeDuplicate},
		{"handler failed", m, "b", failing, middleware.OutcomeHandlerFailed},
		{"in progress", m, "held", ok, middleware.OutcomeInProgress},
		{"unprotected, handler succeeded", unprotected, "c", ok, middleware.OutcomeUnprotected},
		{"unprotected, handler failed", unprotected, "d", failing, middleware.OutcomeUnprotected},
		{"key error", rejecting, "e", ok, middleware.OutcomeKeyError},
		{"store error", down, "f", ok, middleware.OutcomeStoreError},
	} {
		t.Run(c.name, func(t *testing.T) {
			ev, err := deliver(t, c.m, newMsg(c.uuid, "x"), c.h)
			require.Equal(t, c.want, ev.Outcome)
			require.Equal(t, err == nil, ev.Acked(), "Acked with error %v", err)
			handlerFailed := c.name == "handler failed" || c.name == "unprotected, handler failed"
			require.Equal(t, handlerFailed, errors.Is(ev.HandlerErr, errBoom), "HandlerErr %v", ev.HandlerErr)
		})
	}
}

// Each delivery's event names the router handler it came through.
func TestEventNamesTheHandler(t *testing.T) {
	var mu sync.Mutex
	handlers := map[string]int{}
	m, counters := newMiddleware(t, newMemstore(), func(c *middleware.Config) {
		c.Namespace = ""
		c.Observer = middleware.MultiObserver(c.Observer, slotObserver, middleware.ObserverFunc(func(_ context.Context, ev middleware.Event) {
			mu.Lock()
			defer mu.Unlock()
			handlers[ev.Handler]++
		}))
	})
	env := newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		r.AddMiddleware(m.Middleware)
		r.AddConsumerHandler("billing", "in", ps, func(*message.Message) error { return nil })
		r.AddConsumerHandler("shipping", "in", ps, func(*message.Message) error { return nil })
	})
	env.publish(t, "in", newMsg("m1", "x"), newMsg("m1", "x"))
	waitFor(t, "four deliveries", func() bool { return total(counters) == 4 })
	mu.Lock()
	require.Equal(t, map[string]int{"billing": 2, "shipping": 2}, handlers)
	mu.Unlock()

	ev, err := deliver(t, m, newMsg("m2", "x"), func(*message.Message) ([]*message.Message, error) { return nil, nil })
	require.ErrorIs(t, err, middleware.ErrNoNamespace)
	require.Empty(t, ev.Handler, "outside a router")
}

func TestMultiObserverTellsEachInOrderSkippingNil(t *testing.T) {
	var got []string
	rec := func(name string) middleware.Observer {
		return middleware.ObserverFunc(func(_ context.Context, ev middleware.Event) {
			got = append(got, name+":"+ev.Outcome.String())
		})
	}
	counters := &middleware.Counters{}
	obs := middleware.MultiObserver(rec("first"), nil, counters, rec("second"))
	m, _ := newMiddleware(t, newMemstore(), func(c *middleware.Config) { c.Observer = obs })
	_, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(newMsg("k", "x"))
	require.NoError(t, err)
	require.Equal(t, []string{"first:processed", "second:processed"}, got)
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessed))

	middleware.MultiObserver().Observe(context.Background(), middleware.Event{}) // none: nothing to tell
}

// A replay drops the metadata keys it is told to, and keeps the rest; the
// stored record is untouched, so every replay is alike.
func TestReplayDropMetadata(t *testing.T) {
	store := newMemstore()
	produce := func(msg *message.Message) ([]*message.Message, error) {
		out := message.NewMessage("out-"+msg.UUID, []byte("charged"))
		out.Metadata.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		out.Metadata.Set("tracestate", "vendor=1")
		out.Metadata.Set("order", "o-1")
		return []*message.Message{out}, nil
	}
	plain, _ := newMiddleware(t, store, nil)
	dropping, _ := newMiddleware(t, store, func(c *middleware.Config) {
		c.ReplayDropMetadata = []string{"traceparent", "tracestate", "not-there"}
	})

	first, err := plain.Middleware(produce)(newMsg("m1", "x"))
	require.NoError(t, err)
	require.Equal(t, "vendor=1", first[0].Metadata.Get("tracestate"), "the first delivery's output is the handler's own")

	for range 2 {
		replayed, err := dropping.Middleware(produce)(newMsg("m1", "x"))
		require.NoError(t, err)
		require.Len(t, replayed, 1)
		require.Equal(t, "out-m1", replayed[0].UUID)
		require.Equal(t, map[string]string{"order": "o-1"}, map[string]string(replayed[0].Metadata))
	}
	exact, err := plain.Middleware(produce)(newMsg("m1", "x"))
	require.NoError(t, err)
	require.Len(t, exact[0].Metadata, 3, "without the option a replay is an exact copy")
}

// A nil *Counters (or other nil pointer) as the observer means none.
func TestNilPointerObserverIsNone(t *testing.T) {
	var counters *middleware.Counters
	m, err := middleware.New(middleware.Config{Store: newMemstore(), Namespace: "n", Observer: counters})
	require.NoError(t, err)
	_, err = m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(newMsg("k", "x"))
	require.NoError(t, err)
}
