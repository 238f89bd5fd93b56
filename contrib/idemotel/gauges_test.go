package idemotel_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/contrib/idemotel"
)

const (
	recordsGauge = "watermill.idempotency.store.records"
	oldestGauge  = "watermill.idempotency.store.oldest_in_progress.age"
	backlogGauge = "watermill.idempotency.outbox.backlog"
	sentAgeGauge = "watermill.idempotency.outbox.oldest.age"
	storeHist    = "watermill.idempotency.store.operation.duration"
)

// gauge returns a gauge's values by the values of the given attributes,
// joined with "/"; a gauge not reported gives an empty map.
func gauge(t *testing.T, agg metricdata.Aggregation, keys ...attribute.Key) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	switch g := agg.(type) {
	case nil:
	case metricdata.Gauge[int64]:
		for _, dp := range g.DataPoints {
			out[label(dp.Attributes, keys)] = float64(dp.Value)
		}
	case metricdata.Gauge[float64]:
		for _, dp := range g.DataPoints {
			out[label(dp.Attributes, keys)] = dp.Value
		}
	default:
		t.Fatalf("%T is not a gauge", agg)
	}
	return out
}

// waitFor collects until cond holds of the data, and returns that data.
func (tel *telemetry) waitFor(t *testing.T, what string, cond func(map[string]metricdata.Aggregation) bool) map[string]metricdata.Aggregation {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		data := tel.collect(t)
		if cond(data) {
			return data
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s; last collected: %v", what, data)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func has(name string) func(map[string]metricdata.Aggregation) bool {
	return func(data map[string]metricdata.Aggregation) bool { return data[name] != nil }
}

func newGauges(t *testing.T, cfg idemotel.GaugesConfig) *idemotel.Gauges {
	t.Helper()
	g, err := idemotel.NewGauges(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.Close()) })
	return g
}

func TestGaugesConfig(t *testing.T) {
	store := newMemstore()
	outbox := backlogFunc(func(context.Context) (int64, time.Duration, error) { return 0, 0, nil })
	for name, cfg := range map[string]idemotel.GaugesConfig{
		"nothing":            {},
		"no namespace":       {Store: store},
		"empty namespace":    {Store: store, Namespaces: []string{"a", ""}},
		"repeated namespace": {Store: store, Namespaces: []string{"a", "b", "a"}},
		"namespace, outbox":  {Namespaces: []string{"a"}, Outbox: outbox},
		"negative interval":  {Store: store, Namespaces: []string{"a"}, Interval: -time.Second},
		"negative timeout":   {Store: store, Namespaces: []string{"a"}, Timeout: -time.Second},
		"timeout > interval": {Store: store, Namespaces: []string{"a"}, Interval: time.Second, Timeout: 2 * time.Second},
		"nil store":          {Store: (*memstore.Store)(nil), Namespaces: []string{"a"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := idemotel.NewGauges(cfg)
			require.ErrorIs(t, err, idemotel.ErrInvalidConfig)
		})
	}
	// The timeout defaults to the interval when that is shorter than
	// DefaultGaugesTimeout; only the outbox is fine too.
	tel := newTelemetry(t)
	newGauges(t, idemotel.GaugesConfig{MeterProvider: tel.meters, Outbox: outbox, Interval: time.Second})
}

type backlogFunc func(context.Context) (int64, time.Duration, error)

func (f backlogFunc) Backlog(ctx context.Context) (int64, time.Duration, error) { return f(ctx) }

// The records of each namespace by state, and the age of the oldest lease
// in progress, on the in-memory store, whose clock the test sets.
func TestGaugesCountRecords(t *testing.T) {
	var offset atomic.Int64 // the store's clock, ahead of the wall clock
	store, err := memstore.New(memstore.Options{Now: func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }})
	require.NoError(t, err)
	ctx := context.Background()
	acquire := func(key string, ttl time.Duration) backends.Lease {
		t.Helper()
		res, err := store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: "o-" + key, LeaseTTL: ttl, Retention: time.Hour})
		require.NoError(t, err)
		require.Equal(t, backends.StatusAcquired, res.Status)
		return res.Lease
	}
	offset.Store(int64(-time.Hour))
	acquire("pay:held", 2*time.Hour)    // in progress, acquired an hour ago
	acquire("pay:gone", 30*time.Minute) // expired half an hour ago
	offset.Store(0)
	require.NoError(t, store.Release(ctx, acquire("pay:failed", time.Minute)))
	acquire("pay:recent", time.Hour) // in progress, just acquired: not the oldest
	require.NoError(t, store.Complete(ctx, acquire("pay:done", time.Minute), nil))
	require.NoError(t, store.Complete(ctx, acquire("ship:done", time.Minute), nil))

	tel := newTelemetry(t)
	newGauges(t, idemotel.GaugesConfig{MeterProvider: tel.meters, Store: store, Namespaces: []string{"pay", "ship", "none"}, Interval: time.Hour})
	data := tel.waitFor(t, "the first collection", has(recordsGauge))

	require.Equal(t, map[string]float64{
		"pay/in_progress": 2, "pay/expired": 1, "pay/released": 1, "pay/completed": 1,
		"ship/in_progress": 0, "ship/expired": 0, "ship/released": 0, "ship/completed": 1,
		"none/in_progress": 0, "none/expired": 0, "none/released": 0, "none/completed": 0,
	}, gauge(t, data[recordsGauge], idemotel.AttrNamespace, idemotel.AttrState))
	ages := gauge(t, data[oldestGauge], idemotel.AttrNamespace)
	require.Len(t, ages, 3)
	require.GreaterOrEqual(t, ages["pay"], time.Hour.Seconds(), "the lease acquired an hour ago is the oldest")
	require.Zero(t, ages["ship"])
	require.Zero(t, ages["none"])
	require.Equal(t, map[string]uint64{"count/": 3}, counts(t, data[storeHist], idemotel.AttrOperation, idemotel.AttrErrorType))
	require.Nil(t, data[backlogGauge], "no outbox, no backlog")
}

// On Redis, the age of the oldest lease is reported when the store says
// when each lease was acquired, and left out when it does not.
func TestGaugesRedis(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: service(t, "REDIS_ADDR")})
	t.Cleanup(func() { _ = client.Close() })
	prefix := unique("idemotel-gauges-")
	store, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	require.NoError(t, err)
	t.Cleanup(func() {
		keys, _ := client.Keys(context.Background(), prefix+"*").Result()
		if len(keys) > 0 {
			client.Del(context.Background(), keys...)
		}
	})
	ctx := context.Background()
	res, err := store.Acquire(ctx, backends.AcquireRequest{Key: "pay:held", Owner: "o1", LeaseTTL: time.Hour, Retention: time.Hour})
	require.NoError(t, err)
	res2, err := store.Acquire(ctx, backends.AcquireRequest{Key: "pay:done", Owner: "o2", LeaseTTL: time.Hour, Retention: time.Hour})
	require.NoError(t, err)
	require.NoError(t, store.Complete(ctx, res2.Lease, nil))
	rec, err := store.Inspect(ctx, res.Lease.Key)
	require.NoError(t, err)
	heldAtLeast := time.Since(rec.AcquiredAt) // by this clock, before the collection

	tel := newTelemetry(t)
	newGauges(t, idemotel.GaugesConfig{MeterProvider: tel.meters, Store: store, Namespaces: []string{"pay"}, Interval: time.Hour})
	data := tel.waitFor(t, "the first collection", has(recordsGauge))
	require.Equal(t, map[string]float64{"pay/in_progress": 1, "pay/expired": 0, "pay/released": 0, "pay/completed": 1},
		gauge(t, data[recordsGauge], idemotel.AttrNamespace, idemotel.AttrState))
	ages := gauge(t, data[oldestGauge], idemotel.AttrNamespace)
	if rec.AcquiredAt.IsZero() {
		require.Empty(t, ages, "a store that does not say when a lease was acquired has no age to report")
	} else {
		require.GreaterOrEqual(t, ages["pay"], heldAtLeast.Seconds()-1, "the age of the lease (the clocks of Redis and this machine may differ by a little)")
	}
}

// slowLister is a real store whose Count, while frozen, waits until its
// context ends or the test lets it go, as a store that stopped answering
// would; it tracks how many Counts run at once.
type slowLister struct {
	backends.Lister
	frozen  atomic.Bool
	release chan struct{}
	entered chan struct{}
	failing string // a namespace whose Count fails at once

	mu              sync.Mutex
	running, most   int
	calls, timeouts int
}

func (s *slowLister) Count(ctx context.Context, ns string) (backends.Counts, error) {
	s.mu.Lock()
	s.running++
	s.calls++
	s.most = max(s.most, s.running)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running--
		s.mu.Unlock()
	}()
	if ns == s.failing {
		return backends.Counts{}, errors.New("the store said no")
	}
	if s.frozen.Load() {
		select {
		case s.entered <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			s.mu.Lock()
			s.timeouts++
			s.mu.Unlock()
			return backends.Counts{}, ctx.Err()
		case <-s.release:
		}
	}
	return s.Lister.Count(ctx, ns)
}

// A store that does not answer holds up no reader, is never asked twice
// at once, and shows as timeouts of count; its gauges are left out until
// it answers again.
func TestGaugesSlowStore(t *testing.T) {
	store := &slowLister{Lister: newMemstore(), release: make(chan struct{}), entered: make(chan struct{}, 1)}
	store.frozen.Store(true)
	tel := newTelemetry(t)
	g := newGauges(t, idemotel.GaugesConfig{MeterProvider: tel.meters, Store: store, Namespaces: []string{"pay"},
		Interval: 20 * time.Millisecond, Timeout: 10 * time.Millisecond})

	// Readers collect all along, from several goroutines at once.
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 4 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					var rm metricdata.ResourceMetrics
					_ = tel.reader.Collect(context.Background(), &rm)
				}
			}
		})
	}
	data := tel.waitFor(t, "three timed-out counts", func(data map[string]metricdata.Aggregation) bool {
		return counts(t, data[storeHist], idemotel.AttrOperation, idemotel.AttrErrorType)["count/timeout"] >= 3
	})
	require.Nil(t, data[recordsGauge], "nothing to report while the store does not answer")

	store.frozen.Store(false)
	tel.waitFor(t, "the store's answer", has(recordsGauge))
	close(stop)
	readers.Wait()
	require.NoError(t, g.Close())
	store.mu.Lock()
	defer store.mu.Unlock()
	require.Equal(t, 1, store.most, "one Count at a time")
	require.GreaterOrEqual(t, store.timeouts, 3)
}

// While a collection waits for the store, a reader is not held up: it
// gets the last collection's values (here none yet) while the Count still
// waits.
func TestGaugesReaderNotHeldUp(t *testing.T) {
	store := &slowLister{Lister: newMemstore(), release: make(chan struct{}), entered: make(chan struct{}, 1)}
	store.frozen.Store(true)
	tel := newTelemetry(t)
	newGauges(t, idemotel.GaugesConfig{MeterProvider: tel.meters, Store: store, Namespaces: []string{"pay"},
		Interval: time.Hour, Timeout: time.Hour})
	<-store.entered // the first Count waits for the store
	got := make(chan map[string]metricdata.Aggregation, 1)
	go func() {
		var rm metricdata.ResourceMetrics
		_ = tel.reader.Collect(context.Background(), &rm)
		out := map[string]metricdata.Aggregation{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				out[m.Name] = m.Data
			}
		}
		got <- out
	}()
	var data map[string]metricdata.Aggregation
	select {
	case data = <-got:
	case <-time.After(time.Minute): // the Count waits for an hour
		close(store.release)
		t.Fatal("a reader waited a minute for a Count that waits for the store")
	}
	store.mu.Lock()
	running := store.running
	store.mu.Unlock()
	require.Equal(t, 1, running, "the reader got its answer while the Count still waited")
	require.Nil(t, data[recordsGauge], "no collection has ended yet")
	close(store.release)
	tel.waitFor(t, "the first collection", has(recordsGauge))
}

// A namespace whose Count fails is left out and counted as an error; the
// others are reported.
func TestGaugesStoreError(t *testing.T) {
	store := &slowLister{Lister: newMemstore(), failing: "bad"}
	tel := newTelemetry(t)
	newGauges(t, idemotel.GaugesConfig{MeterProvider: tel.meters, Store: store, Namespaces: []string{"good", "bad"}, Interval: time.Hour})
	data := tel.waitFor(t, "the first collection", has(recordsGauge))
	require.Equal(t, map[string]float64{"good/in_progress": 0, "good/expired": 0, "good/released": 0, "good/completed": 0},
		gauge(t, data[recordsGauge], idemotel.AttrNamespace, idemotel.AttrState))
	require.Equal(t, map[string]uint64{"count/": 1, "count/_OTHER": 1}, counts(t, data[storeHist], idemotel.AttrOperation, idemotel.AttrErrorType))
}

func TestGaugesOutbox(t *testing.T) {
	var fail atomic.Bool
	outbox := backlogFunc(func(context.Context) (int64, time.Duration, error) {
		if fail.Load() {
			return 0, 0, errors.New("no such table")
		}
		return 7, 90 * time.Second, nil
	})
	tel := newTelemetry(t)
	g := newGauges(t, idemotel.GaugesConfig{MeterProvider: tel.meters, Outbox: outbox, Interval: 10 * time.Millisecond})
	data := tel.waitFor(t, "the first collection", has(backlogGauge))
	require.Equal(t, map[string]float64{"": 7}, gauge(t, data[backlogGauge]))
	require.Equal(t, map[string]float64{"": 90}, gauge(t, data[sentAgeGauge]))
	require.Nil(t, data[recordsGauge], "no store, no records")

	fail.Store(true)
	data = tel.waitFor(t, "a failed backlog", func(data map[string]metricdata.Aggregation) bool { return data[backlogGauge] == nil })
	require.Positive(t, counts(t, data[storeHist], idemotel.AttrOperation, idemotel.AttrErrorType)["outbox_backlog/_OTHER"])
	require.Nil(t, data[sentAgeGauge])

	require.NoError(t, g.Close())
	require.NoError(t, g.Close(), "Close twice")
	fail.Store(false)
	data = tel.collect(t)
	require.Nil(t, data[backlogGauge], "closed gauges report nothing")
}
