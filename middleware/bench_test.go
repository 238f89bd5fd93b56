package middleware_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-idempotency/idempotency/middleware"
)

// benchMiddlewares are compared in one run: no middleware (the router's own
// cost), Watermill's Deduplicator keyed by UUID (the baseline), and this
// middleware on the in-memory store.
func benchMiddlewares(b *testing.B) []struct {
	name string
	mw   message.HandlerMiddleware
} {
	idem, err := middleware.New(middleware.Config{Store: newMemstore(), Namespace: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	dedup := &wmiddleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}
	return []struct {
		name string
		mw   message.HandlerMiddleware
	}{
		{"mw=none", func(h message.HandlerFunc) message.HandlerFunc { return h }},
		{"mw=deduplicator", dedup.Middleware},
		{"mw=idempotency", idem.Middleware},
	}
}

// BenchmarkRouter measures the cost per message through a GoChannel router:
// one op is one unique message published, handled and acked.
func BenchmarkRouter(b *testing.B) {
	for _, bm := range benchMiddlewares(b) {
		b.Run(bm.name, func(b *testing.B) {
			logger := watermill.NopLogger{}
			ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, logger)
			r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
			if err != nil {
				b.Fatal(err)
			}
			var handled atomic.Int64
			r.AddConsumerHandler("bench", "in", ps, func(*message.Message) error {
				handled.Add(1)
				return nil
			}).AddMiddleware(bm.mw)
			go func() { _ = r.Run(context.Background()) }()
			<-r.Running()
			defer func() { _ = r.Close(); _ = ps.Close() }()

			next := uniqueMessages()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := ps.Publish("in", next()); err != nil {
					b.Fatal(err)
				}
			}
			for handled.Load() < int64(b.N) {
				time.Sleep(50 * time.Microsecond)
			}
		})
	}
}

// BenchmarkHandler measures the middleware alone: the wrapped handler is
// called directly, as the router would, with a new key each time.
func BenchmarkHandler(b *testing.B) {
	for _, bm := range benchMiddlewares(b) {
		b.Run(bm.name, func(b *testing.B) {
			h := bm.mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
			next := uniqueMessages()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := h(next()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

var benchRun atomic.Int64

// uniqueMessages returns a function that builds a new message on each call,
// with a UUID no earlier message had: a benchmark runs several times on one
// middleware, and a repeated UUID would be a duplicate. Building the
// message is part of every variant's cost, the baseline's included.
func uniqueMessages() func() *message.Message {
	prefix := "m" + strconv.FormatInt(benchRun.Add(1), 10) + "-"
	payload := []byte(`{"order_id":"o-1"}`)
	i := 0
	return func() *message.Message {
		i++
		return message.NewMessage(prefix+strconv.Itoa(i), payload)
	}
}

// BenchmarkHandlerDuplicate measures a delivery of an already completed key.
func BenchmarkHandlerDuplicate(b *testing.B) {
	for _, bm := range benchMiddlewares(b)[1:] {
		b.Run(bm.name, func(b *testing.B) {
			h := bm.mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
			m := message.NewMessage("dup", []byte(`{"order_id":"o-1"}`))
			if _, err := h(m); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := h(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDo measures Do on the in-memory store, a new key each time and
// a completed key, against calling the function itself.
func BenchmarkDo(b *testing.B) {
	idem, err := middleware.New(middleware.Config{Store: newMemstore(), Namespace: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	fn := func(context.Context) (int, error) { return 42, nil }
	ctx := context.Background()
	b.Run("fn=plain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := fn(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fn=new-key", func(b *testing.B) {
		prefix := "k" + strconv.FormatInt(benchRun.Add(1), 10) + "-"
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			i++
			if _, err := middleware.Do(ctx, idem, prefix+strconv.Itoa(i), fn); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fn=duplicate", func(b *testing.B) {
		if _, err := middleware.Do(ctx, idem, "dup", fn); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := middleware.Do(ctx, idem, "dup", fn); err != nil {
				b.Fatal(err)
			}
		}
	})
}
