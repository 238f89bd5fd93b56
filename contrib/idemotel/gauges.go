package idemotel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// ErrInvalidConfig wraps every error [NewGauges] returns about its
// configuration.
var ErrInvalidConfig = errors.New("idemotel: invalid configuration")

// The attributes of the gauges.
const (
	// AttrNamespace is the namespace whose records are counted.
	AttrNamespace = attribute.Key("watermill.idempotency.namespace")
	// AttrState is a record's state: in_progress, expired, released or
	// completed (backends.State's String).
	AttrState = attribute.Key("watermill.idempotency.state")
)

// The store operations the gauges' collections add to
// watermill.idempotency.store.operation.duration.
const (
	// OperationCount is a backends.Lister Count of one namespace.
	OperationCount = "count"
	// OperationOutboxBacklog is an outbox's Backlog.
	OperationOutboxBacklog = "outbox_backlog"
)

// Defaults of [GaugesConfig].
const (
	// DefaultGaugesInterval is what GaugesConfig.Interval defaults to.
	DefaultGaugesInterval = time.Minute
	// DefaultGaugesTimeout is what GaugesConfig.Timeout defaults to, when
	// the interval is longer.
	DefaultGaugesTimeout = 10 * time.Second
)

// OutboxBacklog is an outbox whose unsent messages can be counted:
// contrib/sqloutbox's Postgres and MySQL outboxes implement it.
type OutboxBacklog interface {
	// Backlog returns how many messages wait in the outbox to be
	// forwarded, and how long the oldest of them has waited (zero if none
	// does), by the database's clock.
	Backlog(ctx context.Context) (messages int64, oldest time.Duration, err error)
}

// GaugesConfig configures [NewGauges]: what to collect, and how often.
type GaugesConfig struct {
	// MeterProvider creates the gauges. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider

	// Store is the store whose records are counted, in each of
	// Namespaces. Every store of this module and its store modules is a
	// backends.Lister.
	Store backends.Lister

	// Namespaces are the namespaces to count: the handlers' names, or the
	// middleware's Config.Namespace where it is set. Each is one Count per
	// collection, which on Redis and DynamoDB scans the whole store
	// (docs/operations.md has the cost per store). At least one is
	// required with Store; none may be empty or repeated.
	Namespaces []string

	// Outbox, if set, has its backlog measured at each collection too.
	Outbox OutboxBacklog

	// Interval is the time between the starts of two collections.
	// Defaults to DefaultGaugesInterval.
	Interval time.Duration

	// Timeout bounds each collection, every Count and the Backlog
	// together: what has not answered by then is reported as an error of
	// its operation, and its gauges are left out until a later collection
	// succeeds. It must not be longer than Interval. Defaults to
	// DefaultGaugesTimeout, or Interval if that is shorter.
	Timeout time.Duration
}

func (c GaugesConfig) withDefaults() (GaugesConfig, error) {
	if storekit.IsNil(c.MeterProvider) {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if storekit.IsNil(c.Store) {
		c.Store = nil
	}
	if storekit.IsNil(c.Outbox) {
		c.Outbox = nil
	}
	if c.Interval == 0 {
		c.Interval = DefaultGaugesInterval
	}
	if c.Timeout == 0 {
		c.Timeout = min(DefaultGaugesTimeout, c.Interval)
	}
	switch {
	case c.Store == nil && c.Outbox == nil:
		return c, fmt.Errorf("%w: GaugesConfig needs a Store (with Namespaces) or an Outbox", ErrInvalidConfig)
	case c.Store != nil && len(c.Namespaces) == 0:
		return c, fmt.Errorf("%w: GaugesConfig.Namespaces names no namespace to count the Store's records in", ErrInvalidConfig)
	case c.Store == nil && len(c.Namespaces) > 0:
		return c, fmt.Errorf("%w: GaugesConfig.Namespaces without a Store", ErrInvalidConfig)
	case c.Interval < 0:
		return c, fmt.Errorf("%w: negative GaugesConfig.Interval %v", ErrInvalidConfig, c.Interval)
	case c.Timeout < 0 || c.Timeout > c.Interval:
		return c, fmt.Errorf("%w: GaugesConfig.Timeout %v is not within 0 and the Interval %v", ErrInvalidConfig, c.Timeout, c.Interval)
	}
	for i, ns := range c.Namespaces {
		if ns == "" {
			return c, fmt.Errorf("%w: GaugesConfig.Namespaces[%d] is empty", ErrInvalidConfig, i)
		}
		if slices.Contains(c.Namespaces[:i], ns) {
			return c, fmt.Errorf("%w: GaugesConfig.Namespaces names %q twice", ErrInvalidConfig, ns)
		}
	}
	return c, nil
}

// Gauges reports the state of a store and an outbox as OpenTelemetry
// observable gauges. Create it with [NewGauges] and stop it with Close.
type Gauges struct {
	cfg GaugesConfig

	records, backlog        metric.Int64ObservableGauge
	oldestLease, oldestSent metric.Float64ObservableGauge
	duration                metric.Float64Histogram
	registration            metric.Registration

	// Attribute sets, built once.
	nsSets map[string]nsSets
	opSets map[string]opSets

	mu   sync.Mutex
	last snapshot

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

type nsSets struct {
	byState [4]metric.ObserveOption // in_progress, expired, released, completed
	ns      metric.ObserveOption
}

type opSets struct {
	ok     metric.RecordOption
	failed map[string]metric.RecordOption // by error.type
}

// snapshot is what the last collection found. A namespace whose Count
// failed is not in it; nor is the outbox's backlog if Backlog failed.
type snapshot struct {
	namespaces map[string]nsState
	outbox     *outboxState
}

type nsState struct {
	counts backends.Counts
	// oldest is the age of the oldest live lease; known is false when the
	// store counted leases in progress but did not say when the oldest
	// was acquired (a store that does not fill Counts.OldestInProgress).
	oldest time.Duration
	known  bool
}

type outboxState struct {
	messages int64
	oldest   time.Duration
}

// NewGauges starts collecting what cfg names and reporting it, under the
// instrumentation scope [ScopeName]:
//
//   - watermill.idempotency.store.records, the records of each namespace
//     by state (attributes watermill.idempotency.namespace and
//     watermill.idempotency.state);
//   - watermill.idempotency.store.oldest_in_progress.age, in seconds, how
//     long the oldest lease still in progress in each namespace has been
//     held (0 when none is): a lease held far longer than its handler
//     should take is a stuck handler;
//   - with an Outbox, watermill.idempotency.outbox.backlog, the messages
//     not yet forwarded, and watermill.idempotency.outbox.oldest.age, in
//     seconds, how long the oldest of them has waited.
//
// A goroutine collects at once, then every cfg.Interval, one collection
// at a time: the store is never asked again while it has not answered,
// however many readers (scrapes) there are, and a reader is never held
// up by the store, since the gauges report the last collection's values.
// Each collection's calls are timed in
// watermill.idempotency.store.operation.duration, as store calls are
// (operations [OperationCount] and [OperationOutboxBacklog]), with
// error.type when they fail; what failed is left out of the gauges until
// it succeeds again.
//
// It returns an error wrapping [ErrInvalidConfig] for a configuration
// that cannot work, or an error if an instrument cannot be created.
func NewGauges(cfg GaugesConfig) (*Gauges, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	meter := cfg.MeterProvider.Meter(ScopeName)
	g := &Gauges{cfg: cfg, nsSets: map[string]nsSets{}, opSets: map[string]opSets{}}
	var errs [5]error
	g.records, errs[0] = meter.Int64ObservableGauge("watermill.idempotency.store.records",
		metric.WithUnit("{record}"),
		metric.WithDescription("Records of the idempotency store, by namespace and state, at the last collection."))
	g.oldestLease, errs[1] = meter.Float64ObservableGauge("watermill.idempotency.store.oldest_in_progress.age",
		metric.WithUnit("s"),
		metric.WithDescription("How long the oldest lease in progress of each namespace had been held at the last collection; 0 when none is."))
	g.backlog, errs[2] = meter.Int64ObservableGauge("watermill.idempotency.outbox.backlog",
		metric.WithUnit("{message}"),
		metric.WithDescription("Messages in the outbox not yet forwarded, at the last collection."))
	g.oldestSent, errs[3] = meter.Float64ObservableGauge("watermill.idempotency.outbox.oldest.age",
		metric.WithUnit("s"),
		metric.WithDescription("How long the oldest message not yet forwarded had waited in the outbox at the last collection; 0 when none does."))
	g.duration, errs[4] = storeHistogram(meter)
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("idemotel: creating the gauges: %w", err)
	}

	for _, ns := range cfg.Namespaces {
		var s nsSets
		for st := backends.StateInProgress; st <= backends.StateCompleted; st++ {
			s.byState[st-backends.StateInProgress] = metric.WithAttributeSet(attribute.NewSet(AttrNamespace.String(ns), AttrState.String(st.String())))
		}
		s.ns = metric.WithAttributeSet(attribute.NewSet(AttrNamespace.String(ns)))
		g.nsSets[ns] = s
	}
	for _, op := range []string{OperationCount, OperationOutboxBacklog} {
		name := AttrOperation.String(op)
		s := opSets{ok: metric.WithAttributeSet(attribute.NewSet(name)), failed: map[string]metric.RecordOption{}}
		for _, t := range storeErrorTypes {
			s.failed[t] = metric.WithAttributeSet(attribute.NewSet(name, AttrErrorType.String(t)))
		}
		g.opSets[op] = s
	}

	g.registration, err = meter.RegisterCallback(g.observe, g.records, g.oldestLease, g.backlog, g.oldestSent)
	if err != nil {
		return nil, fmt.Errorf("idemotel: registering the gauges: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel, g.done = cancel, make(chan struct{})
	go g.run(ctx)
	return g, nil
}

// Close stops the collections, waiting for one under way to end (its
// calls are cancelled), and unregisters the gauges. It returns the error
// of the unregistration, the same at every call.
func (g *Gauges) Close() error {
	g.closeOnce.Do(func() {
		g.cancel()
		<-g.done
		g.closeErr = g.registration.Unregister()
	})
	return g.closeErr
}

func (g *Gauges) run(ctx context.Context) {
	defer close(g.done)
	// A tick that comes while a collection runs is dropped: collections
	// never overlap, and Timeout <= Interval keeps them to one per tick.
	ticker := time.NewTicker(g.cfg.Interval)
	defer ticker.Stop()
	for {
		g.collect(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// collect runs one collection and keeps what it found.
func (g *Gauges) collect(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, g.cfg.Timeout)
	defer cancel()
	snap := snapshot{namespaces: make(map[string]nsState, len(g.cfg.Namespaces))}
	for _, ns := range g.cfg.Namespaces {
		start := time.Now()
		c, err := g.cfg.Store.Count(ctx, ns)
		if parent.Err() != nil {
			return // closing: neither an error nor a value
		}
		g.record(ctx, OperationCount, start, err)
		if err != nil {
			continue
		}
		s := nsState{counts: c, known: true}
		switch {
		case c.InProgress == 0:
		case c.OldestInProgress.IsZero():
			s.known = false
		default:
			s.oldest = max(0, time.Since(c.OldestInProgress))
		}
		snap.namespaces[ns] = s
	}
	if g.cfg.Outbox != nil {
		start := time.Now()
		n, oldest, err := g.cfg.Outbox.Backlog(ctx)
		if parent.Err() != nil {
			return
		}
		g.record(ctx, OperationOutboxBacklog, start, err)
		if err == nil {
			snap.outbox = &outboxState{messages: n, oldest: max(0, oldest)}
		}
	}
	g.mu.Lock()
	g.last = snap
	g.mu.Unlock()
}

func (g *Gauges) record(ctx context.Context, op string, start time.Time, err error) {
	sets := g.opSets[op]
	opt := sets.ok
	if err != nil {
		opt = sets.failed[ErrorType(err)]
	}
	// Recorded without the collection's context, which may have timed out.
	g.duration.Record(context.WithoutCancel(ctx), time.Since(start).Seconds(), opt)
}

// observe reports the last collection's values.
func (g *Gauges) observe(_ context.Context, o metric.Observer) error {
	g.mu.Lock()
	snap := g.last
	g.mu.Unlock()
	for ns, s := range snap.namespaces {
		sets := g.nsSets[ns]
		for i, n := range [4]int64{s.counts.InProgress, s.counts.Expired, s.counts.Released, s.counts.Completed} {
			o.ObserveInt64(g.records, n, sets.byState[i])
		}
		if s.known {
			o.ObserveFloat64(g.oldestLease, s.oldest.Seconds(), sets.ns)
		}
	}
	if snap.outbox != nil {
		o.ObserveInt64(g.backlog, snap.outbox.messages)
		o.ObserveFloat64(g.oldestSent, snap.outbox.oldest.Seconds())
	}
	return nil
}
