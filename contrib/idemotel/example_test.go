package idemotel_test

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/contrib/idemotel"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// setup is the wiring the operations guide shows: the observer, the
// instrumented store, and replays without the first delivery's trace.
func setup(store backends.Store, counters *idempotency.Counters) (*idempotency.Idempotency, error) {
	// snippet:setup
	// Metrics go to the global meter provider (set by your OpenTelemetry
	// setup, e.g. with the Prometheus or OTLP exporter), span events to the
	// span a tracing middleware outside this one started.
	observer, err := idemotel.NewObserver(idemotel.Config{})
	if err != nil {
		return nil, err
	}
	instrumented, err := idemotel.InstrumentStore(store, idemotel.StoreConfig{})
	if err != nil {
		return nil, err
	}
	idem, err := idempotency.New(idempotency.Config{
		Store:    instrumented,
		Observer: idempotency.MultiObserver(observer, counters),
		// Replays do not carry the trace context of the first delivery.
		ReplayDropMetadata: idemotel.PropagationKeys(otel.GetTextMapPropagator()),
	})
	// end snippet
	return idem, err
}

// The observer counts deliveries by outcome, here read with the SDK's
// manual reader instead of an exporter.
func ExampleNewObserver() {
	reader := sdkmetric.NewManualReader()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))

	store, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	counters := &idempotency.Counters{}
	idem, err := setup(store, counters)
	if err != nil {
		panic(err)
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router.AddConsumerHandler("charge", "orders", pubSub, func(*message.Message) error { return nil }).
		AddMiddleware(idem.Middleware)
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	defer router.Close()

	for i, uuid := range []string{"m1", "m2", "m1"} {
		if err := pubSub.Publish("orders", message.NewMessage(uuid, nil)); err != nil {
			panic(err)
		}
		for counters.Count(idempotency.OutcomeProcessed)+counters.Count(idempotency.OutcomeDuplicate) <= int64(i) {
			time.Sleep(time.Millisecond)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	var lines []string
	for _, m := range rm.ScopeMetrics[0].Metrics {
		sum, ok := m.Data.(metricdata.Sum[int64])
		if !ok {
			continue
		}
		for _, dp := range sum.DataPoints {
			if dp.Value == 0 {
				continue // the rarer outcomes, which start at zero
			}
			handler, _ := dp.Attributes.Value(idemotel.AttrHandler)
			outcome, _ := dp.Attributes.Value(idemotel.AttrOutcome)
			lines = append(lines, fmt.Sprintf("%s{handler=%s,outcome=%s} %d", m.Name, handler.AsString(), outcome.AsString(), dp.Value))
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// watermill.idempotency.deliveries{handler=charge,outcome=duplicate} 1
	// watermill.idempotency.deliveries{handler=charge,outcome=processed} 2
}

// The gauges count a store's records by state in the namespaces named,
// here read with the SDK's manual reader once the first collection is in.
func ExampleNewGauges() {
	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, key := range []string{"charge:o1", "charge:o2"} {
		res, err := store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: "w1", LeaseTTL: time.Minute, Retention: time.Hour})
		if err != nil {
			panic(err)
		}
		if key == "charge:o1" {
			if err := store.Complete(ctx, res.Lease, nil); err != nil {
				panic(err)
			}
		}
	}

	// snippet:gauges
	gauges, err := idemotel.NewGauges(idemotel.GaugesConfig{
		MeterProvider: meters,
		Store:         store, // any store: each is a backends.Lister
		// The handlers' names, or Config.Namespace where it is set.
		Namespaces: []string{"charge"},
		// One Count per namespace a minute; on Redis and DynamoDB a Count
		// scans the whole store (docs/operations.md has the cost).
		Interval: time.Minute,
	})
	if err != nil {
		panic(err)
	}
	defer gauges.Close()
	// end snippet

	var lines []string
	for len(lines) == 0 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			panic(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if g, ok := m.Data.(metricdata.Gauge[int64]); ok {
					for _, dp := range g.DataPoints {
						state, _ := dp.Attributes.Value(idemotel.AttrState)
						lines = append(lines, fmt.Sprintf("%s{state=%s} %d", m.Name, state.AsString(), dp.Value))
					}
				}
			}
		}
		time.Sleep(time.Millisecond)
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// watermill.idempotency.store.records{state=completed} 1
	// watermill.idempotency.store.records{state=expired} 0
	// watermill.idempotency.store.records{state=in_progress} 1
	// watermill.idempotency.store.records{state=released} 0
}
