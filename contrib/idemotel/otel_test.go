package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/contrib/idemotel"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// A closed Redis Streams subscriber's reader sleeps out its 500ms
		// back-off before it sees the close.
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream.(*Subscriber).read"))
}

func ok(*message.Message) ([]*message.Message, error) { return nil, nil }

// A store that stops answering (every call to Redis hangs until its
// deadline, as with a frozen server) shows as timeouts on the store
// histogram and a store_error delivery.
func TestPausedStoreIsATimeout(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: service(t, "REDIS_ADDR"), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	frozen := &freezer{}
	client.AddHook(frozen)
	store, err := redisstore.New(client, redisstore.Options{Prefix: unique("otel-paused-")})
	require.NoError(t, err)
	tel := newTelemetry(t)
	instrumented, err := idemotel.InstrumentStore(store, idemotel.StoreConfig{MeterProvider: tel.meters})
	require.NoError(t, err)
	obs, err := idemotel.NewObserver(idemotel.Config{MeterProvider: tel.meters})
	require.NoError(t, err)
	idem, err := idempotency.New(idempotency.Config{
		Store: instrumented, Namespace: "pay", Observer: obs,
		Timing: idempotency.Timing{StoreTimeout: 300 * time.Millisecond, StoreBackoff: idempotency.Backoff{Max: 50 * time.Millisecond}},
	})
	require.NoError(t, err)

	_, err = idem.Middleware(ok)(message.NewMessage("before", nil))
	require.NoError(t, err)
	frozen.on.Store(true)
	_, err = idem.Middleware(ok)(message.NewMessage("during", nil))
	require.ErrorIs(t, err, idempotency.ErrStore)

	data := tel.collect(t)
	require.Equal(t, map[string]int64{"processed/true/": 1, "store_error/false/timeout": 1},
		sums(t, data["watermill.idempotency.deliveries"], idemotel.AttrOutcome, idemotel.AttrAcked, idemotel.AttrErrorType))
	ops := counts(t, data["watermill.idempotency.store.operation.duration"], idemotel.AttrOperation, idemotel.AttrErrorType)
	require.Positive(t, ops["acquire/timeout"], "%v", ops)
	require.Equal(t, uint64(1), ops["acquire/"], "%v", ops)
	require.Equal(t, uint64(1), ops["complete/"], "%v", ops)
}

// bare is a store without optional capabilities.
type bare struct{ backends.Store }

// limited is the in-memory store with an output limit, as DynamoDB's.
type limited struct{ *memstore.Store }

func (limited) MaxOutputBytes() int { return 4096 }

// The instrumented store keeps the pool size the middleware sizes its
// acquisitions by and the store's output limit, and lists only if the
// store does.
func TestInstrumentStoreKeepsCapabilities(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 10})
	t.Cleanup(func() { _ = client.Close() })
	rs, err := redisstore.New(client, redisstore.Options{})
	require.NoError(t, err)
	wrapped, err := idemotel.InstrumentStore(rs, idemotel.StoreConfig{})
	require.NoError(t, err)
	ps, ok := wrapped.(backends.PoolSizer)
	require.True(t, ok)
	require.Equal(t, 10, ps.PoolSize())
	_, ok = wrapped.(backends.Lister)
	require.True(t, ok)

	require.Zero(t, wrapped.(backends.OutputLimiter).MaxOutputBytes(), "Redis sets no output limit")

	wrapped, err = idemotel.InstrumentStore(limited{newMemstore()}, idemotel.StoreConfig{})
	require.NoError(t, err)
	require.Zero(t, wrapped.(backends.PoolSizer).PoolSize(), "0: unknown, as for a store that does not say")
	require.Equal(t, 4096, wrapped.(backends.OutputLimiter).MaxOutputBytes())
	_, ok = wrapped.(backends.Lister)
	require.True(t, ok)

	wrapped, err = idemotel.InstrumentStore(bare{newMemstore()}, idemotel.StoreConfig{})
	require.NoError(t, err)
	_, ok = wrapped.(backends.Lister)
	require.False(t, ok, "no listing the store lacks")

	_, err = idemotel.InstrumentStore(nil, idemotel.StoreConfig{})
	require.ErrorIs(t, err, backends.ErrNilClient)
	_, err = idemotel.InstrumentStore((*memstore.Store)(nil), idemotel.StoreConfig{})
	require.ErrorIs(t, err, backends.ErrNilClient, "a typed nil store")
}

// Store spans are children of the span in the call's context, and only
// made when asked for.
func TestStoreSpans(t *testing.T) {
	for _, spans := range []bool{false, true} {
		t.Run(fmt.Sprintf("spans=%v", spans), func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			store, err := idemotel.InstrumentStore(newMemstore(), idemotel.StoreConfig{
				MeterProvider: newTelemetry(t).meters, TracerProvider: tp, Spans: spans, RecordKey: true,
			})
			require.NoError(t, err)
			ctx, parent := tp.Tracer("test").Start(context.Background(), "process")
			res, err := store.Acquire(ctx, backends.AcquireRequest{Key: "k", Owner: "o", LeaseTTL: time.Second})
			require.NoError(t, err)
			require.NoError(t, store.Complete(ctx, res.Lease, nil))
			_, err = store.Inspect(ctx, "missing")
			require.ErrorIs(t, err, backends.ErrNotFound)
			require.ErrorIs(t, store.Renew(ctx, res.Lease, time.Second), backends.ErrLeaseLost)
			parent.End()

			ended := rec.Ended()
			if !spans {
				require.Len(t, ended, 1, "only the parent")
				return
			}
			require.Len(t, ended, 5)
			var got []string
			for _, s := range ended[:4] {
				require.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID())
				attrs := attribute.NewSet(s.Attributes()...)
				key, _ := attrs.Value(idemotel.AttrKey)
				et, _ := attrs.Value(idemotel.AttrErrorType)
				got = append(got, fmt.Sprintf("%s key=%s error=%s status=%s", s.Name(), key.AsString(), et.AsString(), s.Status().Code))
			}
			require.Equal(t, []string{
				"idempotency.store.acquire key=k error= status=Unset",
				"idempotency.store.complete key=k error= status=Unset",
				"idempotency.store.inspect key=missing error=not_found status=Unset",
				"idempotency.store.renew key=k error=lease_lost status=Error",
			}, got)
		})
	}
}

// Span events: none without a recording span, none when disabled, the key
// only when asked for.
func TestSpanEventOptions(t *testing.T) {
	for _, c := range []struct {
		name    string
		cfg     idemotel.Config
		events  int
		withKey bool
	}{
		{"default", idemotel.Config{}, 1, false},
		{"disabled", idemotel.Config{DisableSpanEvents: true}, 0, false},
		{"with key", idemotel.Config{RecordKey: true}, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tel := newTelemetry(t)
			c.cfg.MeterProvider = tel.meters
			obs, err := idemotel.NewObserver(c.cfg)
			require.NoError(t, err)
			idem, err := idempotency.New(idempotency.Config{Store: newMemstore(), Namespace: "pay", Observer: obs})
			require.NoError(t, err)

			_, err = idem.Middleware(ok)(message.NewMessage("no-span", nil)) // nothing to add to
			require.NoError(t, err)
			msg := message.NewMessage("m1", nil)
			ctx, span := tel.tracer.Start(context.Background(), "process")
			msg.SetContext(ctx)
			_, err = idem.Middleware(ok)(msg)
			require.NoError(t, err)
			span.End()

			ended := tel.spans.Ended()
			require.Len(t, ended, 1)
			require.Len(t, ended[0].Events(), c.events)
			if c.events == 0 {
				return
			}
			attrs := attribute.NewSet(ended[0].Events()[0].Attributes...)
			key, has := attrs.Value(idemotel.AttrKey)
			require.Equal(t, c.withKey, has)
			if has {
				require.Equal(t, "pay:m1", key.AsString())
			}
			attempt, _ := attrs.Value(idemotel.AttrAttempt)
			require.EqualValues(t, 1, attempt.AsInt64())
			takeover, has := attrs.Value("watermill.idempotency.takeover")
			require.True(t, has)
			require.False(t, takeover.AsBool(), "a first lease is no takeover")
			_, has = attrs.Value("watermill.idempotency.waited")
			require.False(t, has, "nobody held the key: no wait to report")
		})
	}
}

// A lease taken over from a holder that stopped renewing it is counted,
// and its span event says so.
func TestTakeoverCounted(t *testing.T) {
	tel := newTelemetry(t)
	obs, err := idemotel.NewObserver(idemotel.Config{MeterProvider: tel.meters})
	require.NoError(t, err)
	store := newMemstore()
	_, err = store.Acquire(context.Background(), backends.AcquireRequest{Key: "pay:m1", Owner: "crashed", LeaseTTL: 20 * time.Millisecond, Retention: time.Hour})
	require.NoError(t, err)
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "pay", Observer: obs,
		Timing: idempotency.Timing{Poll: idempotency.Backoff{Initial: 5 * time.Millisecond}}})
	require.NoError(t, err)
	msg := message.NewMessage("m1", nil)
	ctx, span := tel.tracer.Start(context.Background(), "process")
	msg.SetContext(ctx)
	_, err = idem.Middleware(ok)(msg)
	require.NoError(t, err)
	span.End()
	data := tel.collect(t)
	require.Equal(t, map[string]int64{"": 1}, sums(t, data["watermill.idempotency.takeovers"]))

	ended := tel.spans.Ended()
	require.Len(t, ended, 1)
	require.Len(t, ended[0].Events(), 1)
	attrs := attribute.NewSet(ended[0].Events()[0].Attributes...)
	takeover, has := attrs.Value("watermill.idempotency.takeover")
	require.True(t, has, "a takeover event names it")
	require.Equal(t, attribute.BOOL, takeover.Type())
	require.True(t, takeover.AsBool())
	token, _ := attrs.Value("watermill.idempotency.fencing_token")
	attempt, _ := attrs.Value("watermill.idempotency.attempt")
	require.Equal(t, [2]int64{2, 2}, [2]int64{token.AsInt64(), attempt.AsInt64()}, "the crashed holder had the first lease")
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

func TestErrorType(t *testing.T) {
	for err, want := range map[error]string{
		fmt.Errorf("renew: %w", backends.ErrLeaseLost):                       idemotel.ErrorLeaseLost,
		fmt.Errorf("acquire: %w", backends.ErrInvalidRequest):                idemotel.ErrorInvalidRequest,
		fmt.Errorf("acquire: %w", backends.ErrRejected):                      idemotel.ErrorRejected,
		backends.ErrNotFound:                                                 idemotel.ErrorNotFound,
		fmt.Errorf("%w: %w", idempotency.ErrStore, context.DeadlineExceeded): idemotel.ErrorTimeout,
		&net.OpError{Op: "read", Err: timeoutErr{}}:                          idemotel.ErrorTimeout,
		context.Canceled: idemotel.ErrorCanceled,
		&idempotency.KeyError{Err: errors.New("no field")}:      idemotel.ErrorKey,
		&idempotency.InProgressError{Key: "k"}:                  idemotel.ErrorInProgress,
		fmt.Errorf("%w: k", idempotency.ErrFingerprintMismatch): idemotel.ErrorFingerprintMismatch,
		fmt.Errorf("%w: big", idempotency.ErrOutputTooLarge):    idemotel.ErrorOutputTooLarge,
		fmt.Errorf("k: %w", backends.ErrCorruptOutput):          idemotel.ErrorCorruptOutput,
		idempotency.Permanent(errors.New("unknown product")):    idemotel.ErrorPermanent,
		errors.New("declined"):                                  idemotel.ErrorOther,
	} {
		require.Equal(t, want, idemotel.ErrorType(err), "%v", err)
	}
}

// A handler's permanent failure is error.type permanent, whatever it
// wraps and whatever Config.ErrorType says of handler errors: the poison
// alert and panels count it so.
func TestPermanentFailureIsPermanent(t *testing.T) {
	tel := newTelemetry(t)
	obs, err := idemotel.NewObserver(idemotel.Config{MeterProvider: tel.meters, ErrorType: func(error) string { return "gateway" }})
	require.NoError(t, err)
	idem, err := idempotency.New(idempotency.Config{Store: newMemstore(), Namespace: "pay", Observer: obs})
	require.NoError(t, err)
	_, err = idem.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, idempotency.Permanent(fmt.Errorf("read: %w", context.DeadlineExceeded))
	})(message.NewMessage("m1", nil))
	require.ErrorIs(t, err, idempotency.ErrPermanent)
	got := sums(t, tel.collect(t)["watermill.idempotency.deliveries"], idemotel.AttrOutcome, idemotel.AttrErrorType)
	require.Equal(t, map[string]int64{"handler_failed_permanently/permanent": 1}, got)
}

func TestPropagationKeys(t *testing.T) {
	require.Equal(t, []string{"baggage", "traceparent", "tracestate"}, idemotel.PropagationKeys(nil))
}

func TestNewObserverDefaults(t *testing.T) {
	obs, err := idemotel.NewObserver(idemotel.Config{})
	require.NoError(t, err)
	// The global providers are no-ops until set: recording must still work.
	obs.Observe(trace.ContextWithSpan(context.Background(), trace.SpanFromContext(context.Background())), idempotency.Event{Outcome: idempotency.OutcomeProcessed})
}

// newMemstore is memstore.New with the zero options, which it never
// refuses.
func newMemstore() *memstore.Store {
	s, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	return s
}

// A handler's series of the outcomes an alert waits for start at zero at
// its first delivery, so that the first such outcome is an increase.
func TestSeriesStartAtZero(t *testing.T) {
	tel := newTelemetry(t)
	obs, err := idemotel.NewObserver(idemotel.Config{MeterProvider: tel.meters})
	require.NoError(t, err)
	obs.Observe(context.Background(), idempotency.Event{Outcome: idempotency.OutcomeProcessed, Handler: "charge"})
	obs.Observe(context.Background(), idempotency.Event{Outcome: idempotency.OutcomeProcessed, Handler: "charge"})
	data := tel.collect(t)
	points := map[string]int64{}
	for _, dp := range data["watermill.idempotency.deliveries"].(metricdata.Sum[int64]).DataPoints {
		points[label(dp.Attributes, []attribute.Key{idemotel.AttrHandler, idemotel.AttrOutcome, idemotel.AttrAcked, idemotel.AttrErrorType})] = dp.Value
	}
	require.Equal(t, map[string]int64{
		"charge/processed/true/":                                 2,
		"charge/duplicate/true/":                                 0,
		"charge/processed_not_recorded/true/":                    0,
		"charge/in_progress/false/in_progress":                   0,
		"charge/lease_lost/false/lease_lost":                     0,
		"charge/key_error/false/key_error":                       0,
		"charge/fingerprint_mismatch/false/fingerprint_mismatch": 0,
		"charge/output_too_large/false/output_too_large":         0,
	}, points)
	for _, name := range []string{"watermill.idempotency.takeovers", "watermill.idempotency.replayed.messages"} {
		dps := data[name].(metricdata.Sum[int64]).DataPoints
		require.Len(t, dps, 1, name)
		require.Zero(t, dps[0].Value, name)
	}
}
