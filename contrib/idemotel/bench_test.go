package idemotel_test

import (
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/contrib/idemotel"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// BenchmarkHandler measures what the OpenTelemetry observer, and the
// instrumented store on top of it, add to the middleware on the in-memory
// store (the cheapest store, so the overhead is as visible as it gets):
// one op is one new message through the wrapped handler, with the SDK's
// meter provider recording.
func BenchmarkHandler(b *testing.B) {
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	obs, err := idemotel.NewObserver(idemotel.Config{MeterProvider: meters})
	if err != nil {
		b.Fatal(err)
	}
	variants := []struct {
		name     string
		observer idempotency.Observer
		store    func() backends.Store
	}{
		{"mw=idempotency", nil, func() backends.Store { return newMemstore() }},
		{"mw=otel", obs, func() backends.Store { return newMemstore() }},
		{"mw=otel+store", obs, func() backends.Store {
			s, err := idemotel.InstrumentStore(newMemstore(), idemotel.StoreConfig{MeterProvider: meters})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			idem, err := idempotency.New(idempotency.Config{Store: v.store(), Namespace: "bench", Observer: v.observer})
			if err != nil {
				b.Fatal(err)
			}
			h := idem.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
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

// uniqueMessages builds a new message on each call, with a UUID no earlier
// one had, so that every delivery runs the handler.
func uniqueMessages() func() *message.Message {
	prefix := "m" + strconv.FormatInt(benchRun.Add(1), 10) + "-"
	i := 0
	return func() *message.Message {
		i++
		return message.NewMessage(prefix+strconv.Itoa(i), nil)
	}
}
