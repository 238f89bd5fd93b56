package idemotel

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// storeBuckets are the bucket boundaries, in seconds, OpenTelemetry's
// database semantic conventions give for client operations: store calls
// take a millisecond or less when all is well.
var storeBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10}

// StoreConfig configures [InstrumentStore]. The zero value is ready:
// the global meter provider, metrics only.
type StoreConfig struct {
	// MeterProvider creates the histogram. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider

	// Spans starts a span for each store call, a child of the span in the
	// call's context. Off by default: a duplicate waiting for the key's
	// holder calls Acquire again and again, and each call would be a span.
	Spans bool

	// TracerProvider starts the spans. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider

	// RecordKey adds the idempotency key to each span. Keys may hold
	// personal data: see [Config].RecordKey.
	RecordKey bool
}

// storeHistogram creates watermill.idempotency.store.operation.duration,
// the same instrument for the instrumented store and the gauges'
// collections.
func storeHistogram(meter metric.Meter) (metric.Float64Histogram, error) {
	return meter.Float64Histogram("watermill.idempotency.store.operation.duration",
		metric.WithUnit("s"),
		metric.WithDescription("How long each call to the idempotency store took."),
		metric.WithExplicitBucketBoundaries(storeBuckets...))
}

// The store operations, as the operation attribute names them.
const (
	opAcquire = iota
	opRenew
	opComplete
	opRelease
	opInspect
	opDelete
	numOps
)

var opNames = [numOps]string{"acquire", "renew", "complete", "release", "inspect", "delete"}

// storeErrorTypes are the error.type values [ErrorType] can give a store
// call's error.
var storeErrorTypes = []string{ErrorLeaseLost, ErrorInvalidRequest, ErrorRejected, ErrorNotFound,
	ErrorTimeout, ErrorCanceled, ErrorKey, ErrorInProgress, ErrorFingerprintMismatch,
	ErrorOutputTooLarge, ErrorCorruptOutput, ErrorOther}

// AttrStatus is what an Acquire decided: acquired, in_progress or
// completed (store spans only).
const AttrStatus = attribute.Key("watermill.idempotency.store.status")

// InstrumentStore wraps store so that every call is measured: the
// watermill.idempotency.store.operation.duration histogram, in seconds, by
// operation and, for calls that fail, error.type. The wrapper has the
// optional capabilities of the store it wraps, unmeasured: its pool size
// (backends.PoolSizer) and output limit (backends.OutputLimiter), so the
// middleware's defaults do not change, its watches (backends.Watcher), and
// its listing (backends.Lister).
//
// Like a store's constructor, it refuses a nil store, or a typed nil one,
// with an error wrapping backends.ErrNilClient: the wrapped store is the
// client its calls go to. It also returns an error if the histogram cannot
// be created.
func InstrumentStore(store backends.Store, cfg StoreConfig) (backends.Store, error) {
	if storekit.IsNil(store) {
		return nil, fmt.Errorf("idemotel: InstrumentStore: nil store: %w", backends.ErrNilClient)
	}
	mp := cfg.MeterProvider
	if storekit.IsNil(mp) {
		mp = otel.GetMeterProvider()
	}
	hist, err := storeHistogram(mp.Meter(ScopeName))
	if err != nil {
		return nil, fmt.Errorf("idemotel: creating the store histogram: %w", err)
	}
	s := &instrumented{next: store, duration: hist, recordKey: cfg.RecordKey}
	if cfg.Spans {
		tp := cfg.TracerProvider
		if storekit.IsNil(tp) {
			tp = otel.GetTracerProvider()
		}
		s.tracer = tp.Tracer(ScopeName)
	}
	for op := range numOps {
		name := AttrOperation.String(opNames[op])
		s.ok[op] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(name))}
		s.failed[op] = make(map[string][]metric.RecordOption, len(storeErrorTypes))
		for _, t := range storeErrorTypes {
			s.failed[op][t] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(name, AttrErrorType.String(t)))}
		}
	}
	if l, ok := store.(backends.Lister); ok {
		return &struct {
			*instrumented
			backends.Lister
		}{s, l}, nil
	}
	return s, nil
}

// PoolSize implements backends.PoolSizer: the wrapped store's pool size,
// or 0 (unknown) if it reports none.
func (s *instrumented) PoolSize() int {
	if ps, ok := s.next.(backends.PoolSizer); ok {
		return ps.PoolSize()
	}
	return 0
}

// Watch implements backends.Watcher with the wrapped store's, and
// reports not ok if the store cannot wake waiters.
func (s *instrumented) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	return storekit.WatchOf(ctx, s.next, key)
}

// MaxOutputBytes implements backends.OutputLimiter: the wrapped store's
// limit, or 0 (none) if it sets none.
func (s *instrumented) MaxOutputBytes() int {
	if ol, ok := s.next.(backends.OutputLimiter); ok {
		return ol.MaxOutputBytes()
	}
	return 0
}

// instrumented measures each call to next. Its attribute sets are built
// once, so a call allocates nothing for its measurement.
type instrumented struct {
	next      backends.Store
	duration  metric.Float64Histogram
	tracer    trace.Tracer // nil: no spans
	recordKey bool
	ok        [numOps][]metric.RecordOption
	failed    [numOps]map[string][]metric.RecordOption // by error.type; read only
}

// call is one measured store call.
type call struct {
	s     *instrumented
	op    int
	start time.Time
	span  trace.Span // nil without spans
}

func (s *instrumented) begin(ctx context.Context, op int, key string) (context.Context, call) {
	c := call{s: s, op: op}
	if s.tracer != nil {
		attrs := []attribute.KeyValue{AttrOperation.String(opNames[op])}
		if s.recordKey {
			attrs = append(attrs, AttrKey.String(key))
		}
		ctx, c.span = s.tracer.Start(ctx, "idempotency.store."+opNames[op],
			trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	}
	c.start = time.Now()
	return ctx, c
}

func (c call) end(ctx context.Context, err error) {
	elapsed := time.Since(c.start).Seconds()
	opt := c.s.ok[c.op]
	var errType string
	if err != nil {
		errType = ErrorType(err)
		opt = c.s.failed[c.op][errType]
	}
	c.s.duration.Record(ctx, elapsed, opt...)
	if c.span == nil {
		return
	}
	if err != nil {
		c.span.SetAttributes(AttrErrorType.String(errType))
		if errType != ErrorNotFound { // an answer, not a failure
			c.span.SetStatus(codes.Error, errType)
		}
	}
	c.span.End()
}

func (s *instrumented) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	ctx, c := s.begin(ctx, opAcquire, req.Key)
	res, err := s.next.Acquire(ctx, req)
	if c.span != nil && err == nil {
		c.span.SetAttributes(AttrStatus.String(res.Status.String()))
		if res.Status == backends.StatusAcquired {
			c.span.SetAttributes(AttrFencingToken.Int64(res.Lease.Token))
		}
	}
	c.end(ctx, err)
	return res, err
}

func (s *instrumented) Renew(ctx context.Context, l backends.Lease, ttl time.Duration) error {
	ctx, c := s.begin(ctx, opRenew, l.Key)
	err := s.next.Renew(ctx, l, ttl)
	c.end(ctx, err)
	return err
}

func (s *instrumented) Complete(ctx context.Context, l backends.Lease, output []byte) error {
	ctx, c := s.begin(ctx, opComplete, l.Key)
	err := s.next.Complete(ctx, l, output)
	c.end(ctx, err)
	return err
}

func (s *instrumented) Release(ctx context.Context, l backends.Lease) error {
	ctx, c := s.begin(ctx, opRelease, l.Key)
	err := s.next.Release(ctx, l)
	c.end(ctx, err)
	return err
}

func (s *instrumented) Inspect(ctx context.Context, key string) (backends.Record, error) {
	ctx, c := s.begin(ctx, opInspect, key)
	rec, err := s.next.Inspect(ctx, key)
	c.end(ctx, err)
	return rec, err
}

func (s *instrumented) Delete(ctx context.Context, key string) error {
	ctx, c := s.begin(ctx, opDelete, key)
	err := s.next.Delete(ctx, key)
	c.end(ctx, err)
	return err
}
