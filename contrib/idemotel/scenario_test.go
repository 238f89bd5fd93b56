package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/contrib/idemotel"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// telemetry is an SDK meter provider read by hand and a tracer provider
// whose spans are recorded.
type telemetry struct {
	reader *sdkmetric.ManualReader
	meters *sdkmetric.MeterProvider
	spans  *tracetest.SpanRecorder
	tracer trace.Tracer
}

func newTelemetry(t *testing.T) *telemetry {
	tel := &telemetry{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	tel.meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	tel.tracer = tp.Tracer("test")
	t.Cleanup(func() {
		_ = tel.meters.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	return tel
}

// collect returns the metrics recorded so far, by name.
func (tel *telemetry) collect(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, idemotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// sums adds up a counter's data points by the values of the given
// attributes, joined with "/", leaving out the points at zero (the series
// each handler starts at zero: TestSeriesStartAtZero).
func sums(t *testing.T, agg metricdata.Aggregation, keys ...attribute.Key) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	if agg == nil {
		return out
	}
	sum, ok := agg.(metricdata.Sum[int64])
	require.True(t, ok, "%T is not an int64 sum", agg)
	require.True(t, sum.IsMonotonic)
	for _, dp := range sum.DataPoints {
		if dp.Value != 0 {
			out[label(dp.Attributes, keys)] += dp.Value
		}
	}
	return out
}

// counts adds up a histogram's counts by the values of the given attributes.
func counts(t *testing.T, agg metricdata.Aggregation, keys ...attribute.Key) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	if agg == nil {
		return out
	}
	h, ok := agg.(metricdata.Histogram[float64])
	require.True(t, ok, "%T is not a float64 histogram", agg)
	for _, dp := range h.DataPoints {
		out[label(dp.Attributes, keys)] += dp.Count
	}
	return out
}

func label(set attribute.Set, keys []attribute.Key) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		v, _ := set.Value(k)
		parts[i] = v.String()
	}
	return strings.Join(parts, "/")
}

// attributeValues lists every attribute value on every data point.
func attributeValues(data map[string]metricdata.Aggregation) []string {
	var out []string
	add := func(set attribute.Set) {
		for _, kv := range set.ToSlice() {
			out = append(out, kv.Value.String())
		}
	}
	for _, agg := range data {
		switch a := agg.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range a.DataPoints {
				add(dp.Attributes)
			}
		case metricdata.Histogram[float64]:
			for _, dp := range a.DataPoints {
				add(dp.Attributes)
			}
		}
	}
	return out
}

// consumerSpans stands in for a tracing middleware: it starts a CONSUMER
// span around everything inside it, as Watermill tracing wrappers do.
func consumerSpans(tracer trace.Tracer) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx, span := tracer.Start(msg.Context(), "process "+msg.Metadata.Get("order"), trace.WithSpanKind(trace.SpanKindConsumer))
			defer span.End()
			msg.SetContext(ctx)
			return h(msg)
		}
	}
}

// broker is a pub/sub to run the scenario on.
type broker struct {
	pub message.Publisher
	// sub returns a subscriber for one consumer (one handler).
	sub   func(t *testing.T, consumer string) message.Subscriber
	topic func(name string) string
}

// gate lets the first holder of a key run only once a second delivery of
// the key has found it in progress, so that the duplicate waits.
type gate struct {
	backends.Store
	key     string
	waiting chan struct{}
	once    sync.Once
}

func (g *gate) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	res, err := g.Store.Acquire(ctx, req)
	if err == nil && req.Key == g.key && res.Status == backends.StatusInProgress {
		g.once.Do(func() { close(g.waiting) })
	}
	return res, err
}

var errGateway = errors.New("payment gateway timeout")

// runScenario publishes o-1, o-2 (which fails once), o-1 again, and o-3
// twice at once to two consumers, and checks every metric and span event.
func runScenario(t *testing.T, b broker, store backends.Store) {
	tel := newTelemetry(t)
	instrumented, err := idemotel.InstrumentStore(store, idemotel.StoreConfig{MeterProvider: tel.meters})
	require.NoError(t, err)
	g := &gate{Store: instrumented, key: "charge:o-3", waiting: make(chan struct{})}
	obs, err := idemotel.NewObserver(idemotel.Config{
		MeterProvider: tel.meters,
		ErrorType: func(err error) string {
			if errors.Is(err, errGateway) {
				return "gateway"
			}
			return ""
		},
	})
	require.NoError(t, err)
	counters := &idempotency.Counters{}
	idem, err := idempotency.New(idempotency.Config{
		Store:              g,
		Key:                keyfunc.Metadata("order"),
		Namespace:          "charge",
		LeaseTTL:           10 * time.Second,
		Timing:             idempotency.Timing{Poll: idempotency.Backoff{Initial: 10 * time.Millisecond}},
		Observer:           idempotency.MultiObserver(obs, counters),
		ReplayDropMetadata: idemotel.PropagationKeys(nil),
	})
	require.NoError(t, err)

	logger := watermill.NopLogger{}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	router.AddMiddleware(consumerSpans(tel.tracer), idem.Middleware)
	var o2Failed atomic.Bool
	propagator := propagation.TraceContext{}
	handler := func(msg *message.Message) ([]*message.Message, error) {
		order := msg.Metadata.Get("order")
		switch {
		case order == "o-2" && o2Failed.CompareAndSwap(false, true):
			return nil, fmt.Errorf("charging %s: %w", order, errGateway)
		case order == "o-3":
			select {
			case <-g.waiting:
			case <-time.After(time.Minute):
				return nil, errors.New("the duplicate of o-3 never arrived")
			}
		}
		receipt := message.NewMessage("receipt-"+order, []byte(order))
		propagator.Inject(msg.Context(), propagation.MapCarrier(receipt.Metadata))
		return []*message.Message{receipt}, nil
	}
	for _, instance := range []string{"a", "b"} {
		router.AddHandler("instance-"+instance, b.topic(instance), b.sub(t, instance), b.topic("receipts"), b.pub, handler)
	}
	receipts, err := b.sub(t, "receipts-reader").Subscribe(context.Background(), b.topic("receipts"))
	require.NoError(t, err)
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	t.Cleanup(func() { require.NoError(t, router.Close()) })

	var uuids []string
	publish := func(instance, order string) {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"`+order+`"}`))
		msg.Metadata.Set("order", order)
		uuids = append(uuids, msg.UUID)
		require.NoError(t, b.pub.Publish(b.topic(instance), msg))
	}
	settled := func(what string, processed, duplicates int64) {
		t.Helper()
		require.Eventually(t, func() bool {
			return counters.Count(idempotency.OutcomeProcessed) == processed && counters.Count(idempotency.OutcomeDuplicate) == duplicates
		}, time.Minute, 5*time.Millisecond, "%s: %v", what, counters.Snapshot())
	}
	publish("a", "o-1")
	settled("o-1", 1, 0)
	publish("a", "o-2")
	settled("o-2 after its retry", 2, 0)
	publish("b", "o-1")
	settled("o-1 again", 2, 1)
	publish("a", "o-3")
	publish("b", "o-3")
	settled("o-3 twice", 3, 2)

	// Receipts: three first ones carrying their trace, two replays without.
	var withTrace, without int
	for range 5 {
		select {
		case r := <-receipts:
			if r.Metadata.Get("traceparent") != "" {
				withTrace++
			} else {
				without++
			}
			r.Ack()
		case <-time.After(time.Minute):
			t.Fatalf("receipts: %d with a trace, %d without; want 5 in all", withTrace, without)
		}
	}
	require.Equal(t, 3, withTrace, "first receipts carry the trace of the delivery that made them")
	require.Equal(t, 2, without, "replayed receipts carry no trace context")

	data := tel.collect(t)
	require.Equal(t, map[string]int64{
		"processed/true/":              3,
		"duplicate/true/":              2,
		"handler_failed/false/gateway": 1,
	}, sums(t, data["watermill.idempotency.deliveries"], idemotel.AttrOutcome, idemotel.AttrAcked, idemotel.AttrErrorType))
	require.Equal(t, map[string]int64{"instance-a": 4, "instance-b": 2},
		sums(t, data["watermill.idempotency.deliveries"], idemotel.AttrHandler))
	require.Equal(t, map[string]uint64{"processed": 3, "handler_failed": 1},
		counts(t, data["watermill.idempotency.handler.duration"], idemotel.AttrOutcome))
	require.Equal(t, map[string]uint64{"duplicate": 1},
		counts(t, data["watermill.idempotency.wait.duration"], idemotel.AttrOutcome), "o-3's duplicate waited for its holder")
	require.Equal(t, map[string]int64{"": 2}, sums(t, data["watermill.idempotency.replayed.messages"]))
	require.Empty(t, sums(t, data["watermill.idempotency.takeovers"]), "no lease was taken over")

	ops := counts(t, data["watermill.idempotency.store.operation.duration"], idemotel.AttrOperation, idemotel.AttrErrorType)
	require.GreaterOrEqual(t, ops["acquire/"], uint64(7), "six deliveries and at least one look while waiting: %v", ops)
	require.Equal(t, uint64(3), ops["complete/"], "%v", ops)
	require.Equal(t, uint64(1), ops["release/"], "%v", ops)
	for op := range ops {
		require.True(t, strings.HasSuffix(op, "/"), "a store call failed: %v", ops)
	}

	for _, v := range attributeValues(data) {
		require.NotContains(t, v, "o-", "a key on a metric")
		for _, u := range uuids {
			require.NotContains(t, v, u, "a message UUID on a metric")
		}
	}

	checkSpanEvents(t, tel.spans.Ended())
}

// checkSpanEvents checks one delivery event on each consumer span, with
// every attribute the observer sets, under the names it sets them: the
// fencing token and attempt of the lease the handler ran under, takeover
// false on each lease (none was taken over), and waited only on o-3's
// duplicate, which the gate made wait for its holder.
func checkSpanEvents(t *testing.T, spans []sdktrace.ReadOnlySpan) {
	t.Helper()
	var got []string
	for _, s := range spans {
		require.Equal(t, trace.SpanKindConsumer, s.SpanKind())
		require.Equal(t, "Unset", s.Status().Code.String(), "the observer never sets the span's status")
		events := s.Events()
		require.Len(t, events, 1, "span %s", s.Name())
		require.Equal(t, idemotel.EventName, events[0].Name)
		got = append(got, s.Name()+": "+describeAttrs(t, events[0].Attributes))
	}
	sort.Strings(got)
	require.Equal(t, []string{
		"process o-1: watermill.idempotency.acked=true watermill.idempotency.attempt=1 watermill.idempotency.fencing_token=1 watermill.idempotency.outcome=processed watermill.idempotency.takeover=false",
		"process o-1: watermill.idempotency.acked=true watermill.idempotency.outcome=duplicate watermill.idempotency.replayed=1",
		"process o-2: error.type=gateway watermill.idempotency.acked=false watermill.idempotency.attempt=1 watermill.idempotency.fencing_token=1 watermill.idempotency.outcome=handler_failed watermill.idempotency.takeover=false",
		"process o-2: watermill.idempotency.acked=true watermill.idempotency.attempt=2 watermill.idempotency.fencing_token=2 watermill.idempotency.outcome=processed watermill.idempotency.takeover=false",
		"process o-3: watermill.idempotency.acked=true watermill.idempotency.attempt=1 watermill.idempotency.fencing_token=1 watermill.idempotency.outcome=processed watermill.idempotency.takeover=false",
		"process o-3: watermill.idempotency.acked=true watermill.idempotency.outcome=duplicate watermill.idempotency.replayed=1 watermill.idempotency.waited>0",
	}, got)
}

// describeAttrs renders a span event's attributes as name=value, sorted by
// name. A wait's length varies from run to run, so the waited attribute is
// rendered as "waited>0" once it is checked to be a positive number of
// seconds; the key is never expected, so it is refused here.
func describeAttrs(t *testing.T, attrs []attribute.KeyValue) string {
	t.Helper()
	parts := make([]string, 0, len(attrs))
	for _, kv := range attrs {
		name := string(kv.Key)
		require.NotEqual(t, "watermill.idempotency.key", name, "the key only when asked for")
		if name == "watermill.idempotency.waited" {
			require.Equal(t, attribute.FLOAT64, kv.Value.Type(), "waited is in seconds")
			require.Positive(t, kv.Value.AsFloat64(), "waited is set only on a delivery that waited")
			parts = append(parts, name+">0")
			continue
		}
		parts = append(parts, name+"="+kv.Value.String())
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func TestObserverThroughGoChannelRouter(t *testing.T) {
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	runScenario(t, broker{
		pub:   ps,
		sub:   func(*testing.T, string) message.Subscriber { return ps },
		topic: func(name string) string { return "orders-" + name },
	}, newMemstore())
}

func TestObserverThroughRedisStreamsRouter(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: service(t, "REDIS_ADDR")})
	t.Cleanup(func() { _ = client.Close() })
	prefix := unique("otel-")
	t.Cleanup(func() {
		keys, _ := client.Keys(context.Background(), prefix+"*").Result()
		if len(keys) > 0 {
			client.Del(context.Background(), keys...)
		}
	})
	store, err := redisstore.New(client, redisstore.Options{Prefix: prefix + "idem:"})
	require.NoError(t, err)
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, watermill.NopLogger{})
	require.NoError(t, err)
	runScenario(t, broker{
		pub: pub,
		sub: func(t *testing.T, consumer string) message.Subscriber {
			sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
				Client:          client,
				Consumer:        consumer,
				ConsumerGroup:   prefix + consumer,
				OldestId:        "0",
				NackResendSleep: 10 * time.Millisecond,
				BlockTime:       100 * time.Millisecond,
			}, watermill.NopLogger{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Close() })
			return sub
		},
		topic: func(name string) string { return prefix + "orders-" + name },
	}, store)
}
