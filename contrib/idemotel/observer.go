package idemotel

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/watermill-idempotency/idempotency/backends/storekit"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// ScopeName is the instrumentation scope of every metric and span this
// package records: the module's import path.
const ScopeName = "github.com/watermill-idempotency/idempotency/contrib/idemotel"

// The attributes this package records.
const (
	// AttrOutcome is the delivery's outcome: middleware.Outcome's String.
	AttrOutcome = attribute.Key("watermill.idempotency.outcome")
	// AttrAcked tells whether the middleware let the delivery be acked.
	AttrAcked = attribute.Key("watermill.idempotency.acked")
	// AttrHandler is the Watermill router handler's name.
	AttrHandler = attribute.Key("watermill.handler.name")
	// AttrErrorType classifies a failure; see [ErrorType].
	AttrErrorType = attribute.Key("error.type")
	// AttrOperation is the store operation: acquire, renew, complete,
	// release, inspect or delete, and for the gauges' collections count
	// or outbox_backlog.
	AttrOperation = attribute.Key("watermill.idempotency.store.operation")

	// AttrFencingToken is the fencing token of the lease the handler ran
	// under (span events only).
	AttrFencingToken = attribute.Key("watermill.idempotency.fencing_token")
	// AttrAttempt counts the acquisitions of the key, the delivery's own
	// included (span events only).
	AttrAttempt = attribute.Key("watermill.idempotency.attempt")
	// AttrTakeover tells a lease taken over from a holder that stopped
	// renewing it (span events only).
	AttrTakeover = attribute.Key("watermill.idempotency.takeover")
	// AttrWaited is how long, in seconds, the delivery waited for the
	// key's holder (span events only).
	AttrWaited = attribute.Key("watermill.idempotency.waited")
	// AttrReplayed is how many stored messages a duplicate replayed (span
	// events only).
	AttrReplayed = attribute.Key("watermill.idempotency.replayed")
	// AttrKey is the idempotency key, recorded only when
	// Config.RecordKey (or StoreConfig.RecordKey) is set.
	AttrKey = attribute.Key("watermill.idempotency.key")
)

// EventName is the name of the span event added for each delivery.
const EventName = "watermill.idempotency.delivery"

// durationBuckets are the bucket boundaries, in seconds, OpenTelemetry's
// messaging semantic conventions give for durations.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// Config configures [NewObserver]. The zero value is ready: global
// providers, span events on, keys never recorded.
type Config struct {
	// MeterProvider creates the instruments. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider

	// DisableSpanEvents stops the observer from adding an event to the
	// active span for each delivery.
	DisableSpanEvents bool

	// RecordKey adds the idempotency key to each span event. Keys may hold
	// personal data (an e-mail address, an account number): turn this on
	// only where traces may carry them. Metrics never carry the key.
	RecordKey bool

	// ErrorType, if set, classifies a failed handler's error for the
	// error.type attribute; an empty result falls back to [ErrorType].
	// It must return few distinct values: each is a time series.
	ErrorType func(err error) string
}

// Observer records each delivery the middleware reports. Create it with
// [NewObserver]; it is safe for concurrent use.
type Observer struct {
	deliveries, takeovers, replayed metric.Int64Counter
	handlerDuration, waitDuration   metric.Float64Histogram

	spanEvents bool
	recordKey  bool
	errorType  func(error) string

	attrs attrCache
	// handlers holds the names of the handlers whose series were started
	// at zero.
	handlers sync.Map
}

// zeroed are the deliveries whose attributes are known before they
// happen: each handler's series of them start at zero at its first
// delivery, so that the first of a rare outcome is an increase that
// Prometheus's increase() and rate() see, not a series born at 1.
var zeroed = []struct {
	outcome idempotency.Outcome
	errType string
}{
	{idempotency.OutcomeProcessed, ""},
	{idempotency.OutcomeDuplicate, ""},
	{idempotency.OutcomeProcessedNotRecorded, ""},
	{idempotency.OutcomeInProgress, ErrorInProgress},
	{idempotency.OutcomeLeaseLost, ErrorLeaseLost},
	{idempotency.OutcomeKeyError, ErrorKey},
	{idempotency.OutcomeFingerprintMismatch, ErrorFingerprintMismatch},
	{idempotency.OutcomeOutputTooLarge, ErrorOutputTooLarge},
}

var _ idempotency.Observer = (*Observer)(nil)

// NewObserver returns an observer that records to cfg's meter provider,
// or an error if an instrument cannot be created.
func NewObserver(cfg Config) (*Observer, error) {
	mp := cfg.MeterProvider
	if storekit.IsNil(mp) {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(ScopeName)
	o := &Observer{spanEvents: !cfg.DisableSpanEvents, recordKey: cfg.RecordKey, errorType: cfg.ErrorType}
	var errs [5]error
	o.deliveries, errs[0] = meter.Int64Counter("watermill.idempotency.deliveries",
		metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries seen by the idempotency middleware, by outcome."))
	o.handlerDuration, errs[1] = meter.Float64Histogram("watermill.idempotency.handler.duration",
		metric.WithUnit("s"),
		metric.WithDescription("How long the handler ran under its lease."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	o.waitDuration, errs[2] = meter.Float64Histogram("watermill.idempotency.wait.duration",
		metric.WithUnit("s"),
		metric.WithDescription("How long a duplicate waited for the worker holding its key."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	o.takeovers, errs[3] = meter.Int64Counter("watermill.idempotency.takeovers",
		metric.WithUnit("{lease}"),
		metric.WithDescription("Leases taken over from a holder that stopped renewing them."))
	o.replayed, errs[4] = meter.Int64Counter("watermill.idempotency.replayed.messages",
		metric.WithUnit("{message}"),
		metric.WithDescription("Stored output messages replayed for duplicates."))
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("idemotel: creating instruments: %w", err)
		}
	}
	return o, nil
}

// ranHandler reports whether a delivery with outcome o ran the handler
// under a lease.
func ranHandler(o idempotency.Outcome) bool {
	switch o {
	case idempotency.OutcomeProcessed, idempotency.OutcomeProcessedNotRecorded, idempotency.OutcomeHandlerFailed,
		idempotency.OutcomeHandlerFailedPermanently, idempotency.OutcomeLeaseLost, idempotency.OutcomeOutputTooLarge, idempotency.OutcomeUnprotected:
		return true
	}
	return false
}

// Observe implements middleware.Observer.
func (o *Observer) Observe(ctx context.Context, ev idempotency.Event) {
	acked := ev.Acked()
	errType := ""
	if !acked && ev.Err != nil {
		errType = o.classify(ev)
	}
	if _, seen := o.handlers.Load(ev.Handler); !seen {
		o.startAtZero(ctx, ev.Handler)
	}
	sets := o.attrs.get(ev.Handler, ev.Outcome, acked, errType)
	o.deliveries.Add(ctx, 1, sets.delivery...)
	if ranHandler(ev.Outcome) {
		o.handlerDuration.Record(ctx, ev.HandlerDuration.Seconds(), sets.outcome...)
	}
	if ev.Waited > 0 {
		o.waitDuration.Record(ctx, ev.Waited.Seconds(), sets.outcome...)
	}
	if ev.Lease.Takeover {
		o.takeovers.Add(ctx, 1, sets.handler...)
	}
	if ev.Replayed > 0 {
		o.replayed.Add(ctx, int64(ev.Replayed), sets.handler...)
	}
	if o.spanEvents {
		o.addSpanEvent(ctx, ev, acked, errType)
	}
}

// startAtZero adds zero to the handler's series of the zeroed deliveries,
// its takeovers and its replayed messages, once.
func (o *Observer) startAtZero(ctx context.Context, handler string) {
	if _, loaded := o.handlers.LoadOrStore(handler, struct{}{}); loaded {
		return
	}
	for _, z := range zeroed {
		o.deliveries.Add(ctx, 0, o.attrs.get(handler, z.outcome, z.outcome.Acked(), z.errType).delivery...)
	}
	sets := o.attrs.get(handler, idempotency.OutcomeProcessed, true, "")
	o.takeovers.Add(ctx, 0, sets.handler...)
	o.replayed.Add(ctx, 0, sets.handler...)
}

func (o *Observer) classify(ev idempotency.Event) string {
	if ev.Outcome == idempotency.OutcomeHandlerFailedPermanently {
		return ErrorPermanent // whatever it wraps: poison, which alerts count
	}
	if o.errorType != nil && (ev.Outcome == idempotency.OutcomeHandlerFailed || ev.Outcome == idempotency.OutcomeUnprotected) {
		if t := o.errorType(ev.Err); t != "" {
			return t
		}
	}
	return ErrorType(ev.Err)
}

func (o *Observer) addSpanEvent(ctx context.Context, ev idempotency.Event, acked bool, errType string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs, AttrOutcome.String(ev.Outcome.String()), AttrAcked.Bool(acked))
	if ev.Lease.Token != 0 {
		attrs = append(attrs,
			AttrFencingToken.Int64(ev.Lease.Token),
			AttrAttempt.Int(ev.Lease.Attempt),
			AttrTakeover.Bool(ev.Lease.Takeover))
	}
	if ev.Waited > 0 {
		attrs = append(attrs, AttrWaited.Float64(ev.Waited.Seconds()))
	}
	if ev.Replayed > 0 {
		attrs = append(attrs, AttrReplayed.Int(ev.Replayed))
	}
	if errType != "" {
		attrs = append(attrs, AttrErrorType.String(errType))
	}
	if o.recordKey && ev.Key != "" {
		attrs = append(attrs, AttrKey.String(ev.Key))
	}
	span.AddEvent(EventName, trace.WithAttributes(attrs...))
}

// attrSets are the measurement options of one kind of delivery, built once.
// Each is a slice, so that passing it on allocates no variadic argument.
type attrSets struct {
	delivery []metric.AddOption    // handler, outcome, acked, error.type
	outcome  []metric.RecordOption // handler, outcome
	handler  []metric.AddOption    // handler
}

type attrKey struct {
	handler string
	outcome idempotency.Outcome
	acked   bool
	errType string
}

// maxCachedSets bounds the cache: handler names and error types are few,
// but a careless Config.ErrorType must not grow memory without end.
const maxCachedSets = 4096

// attrCache keeps the attribute sets of each kind of delivery, so that
// recording one allocates nothing once its kind has been seen.
type attrCache struct {
	mu sync.RWMutex
	m  map[attrKey]*attrSets
}

func (c *attrCache) get(handler string, outcome idempotency.Outcome, acked bool, errType string) *attrSets {
	k := attrKey{handler, outcome, acked, errType}
	c.mu.RLock()
	s, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return s
	}
	h, oc := AttrHandler.String(handler), AttrOutcome.String(outcome.String())
	delivery := []attribute.KeyValue{h, oc, AttrAcked.Bool(acked)}
	if errType != "" {
		delivery = append(delivery, AttrErrorType.String(errType))
	}
	s = &attrSets{
		delivery: []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(delivery...))},
		outcome:  []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(h, oc))},
		handler:  []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(h))},
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.m[k]; ok {
		return prev
	}
	if c.m == nil {
		c.m = make(map[attrKey]*attrSets)
	}
	if len(c.m) < maxCachedSets {
		c.m[k] = s
	}
	return s
}
