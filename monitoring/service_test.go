package monitoring_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/contrib/idemotel"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// env returns the value of the environment variable name, and fails the
// test if it is not set: `make test` provides it (tools/testenv).
func env(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set. Run the tests with `make test`, which provides it", name)
	}
	return v
}

// unique returns a name unlikely to repeat, holding this run's id.
func unique(prefix string) string {
	return fmt.Sprintf("%s_%s_%d_%d", prefix, os.Getenv("IDEM_TEST_RUN"), os.Getpid(), time.Now().UnixNano())
}

// faults is the real store, with the failures the test asks for by key:
// an Acquire or a Complete refused, for as long as the test says.
type faults struct {
	backends.Store

	mu               sync.Mutex
	refuseAcquire    map[string]bool
	refuseCompletion map[string]bool
}

var errRefused = fmt.Errorf("%w: refused by the test", backends.ErrRejected)

func (f *faults) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	f.mu.Lock()
	refuse := f.refuseAcquire[req.Key]
	f.mu.Unlock()
	if refuse {
		return backends.AcquireResult{}, errRefused
	}
	return f.Store.Acquire(ctx, req)
}

func (f *faults) Complete(ctx context.Context, l backends.Lease, output []byte) error {
	f.mu.Lock()
	refuse := f.refuseCompletion[l.Key]
	f.mu.Unlock()
	if refuse {
		return errRefused
	}
	return f.Store.Complete(ctx, l, output)
}

// service is what a team runs: a router whose handlers run under the
// middleware on a Postgres store, one of them writing its receipts
// through the outbox, with contrib/idemotel's observer, instrumented store
// and gauges served at /metrics through OpenTelemetry's Prometheus
// exporter.
type service struct {
	t          *testing.T
	metricsURL string
	pool       *pgxpool.Pool
	store      *pgstore.Store
	faults     *faults
	counters   *idempotency.Counters
	pubSub     *gochannel.GoChannel
	outboxRows string // the outbox's table

	mu      sync.Mutex
	runs    map[string]int           // handler runs by key
	held    map[string]chan struct{} // keys whose handler waits to be let go
	started chan string              // keys whose handler started and holds
}

// The topics: two copies of the orders consumer share the namespace
// "orders" (so that a duplicate on one finds its key in progress on the
// other); shipments go through the outbox.
const (
	topicA         = "orders-a"
	topicB         = "orders-b"
	topicShipments = "shipments"
	nsOrders       = "orders"
	nsShipments    = "shipments"
	jobName        = "orders-service"
)

func startService(t *testing.T) *service {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, env(t, "TEST_DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	table, topic := unique("monitoring_keys"), unique("monitoring_outbox")
	store, err := pgstore.New(pool, pgstore.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	outbox, err := sqloutbox.NewPostgres(pool, store, sqloutbox.Options{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+table+`, "watermill_`+topic+`", "watermill_offsets_`+topic+`"`)
	})
	s := &service{t: t, pool: pool, store: store, counters: &idempotency.Counters{}, outboxRows: `"watermill_` + topic + `"`,
		faults: &faults{Store: store, refuseAcquire: map[string]bool{}, refuseCompletion: map[string]bool{}},
		runs:   map[string]int{}, held: map[string]chan struct{}{}, started: make(chan string, 16)}

	// /metrics, as the examples serve it.
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		t.Fatal(err)
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = meters.Shutdown(context.Background()) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	s.metricsURL = "http://" + ln.Addr().String() + "/metrics"

	// The wiring of docs/operations.md.
	instrumented, err := idemotel.InstrumentStore(s.faults, idemotel.StoreConfig{MeterProvider: meters})
	if err != nil {
		t.Fatal(err)
	}
	observer, err := idemotel.NewObserver(idemotel.Config{MeterProvider: meters})
	if err != nil {
		t.Fatal(err)
	}
	gauges, err := idemotel.NewGauges(idemotel.GaugesConfig{MeterProvider: meters, Store: store,
		Namespaces: []string{nsOrders, nsShipments}, Outbox: outbox, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gauges.Close() })
	config := func(namespace string) idempotency.Config {
		return idempotency.Config{
			Store:     instrumented,
			Key:       keyfunc.Metadata("key"),
			Namespace: namespace,
			LeaseTTL:  1500 * time.Millisecond,
			Observer:  idempotency.MultiObserver(observer, s.counters),
			Timing: idempotency.Timing{
				InProgressWait: 200 * time.Millisecond,
				Poll:           idempotency.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond},
				StoreBackoff:   idempotency.Backoff{Max: 100 * time.Millisecond},
				PoisonBackoff:  idempotency.Backoff{Max: 100 * time.Millisecond},
			},
		}
	}
	orders, err := idempotency.New(config(nsOrders))
	if err != nil {
		t.Fatal(err)
	}
	shipments, err := idempotency.New(config(nsShipments))
	if err != nil {
		t.Fatal(err)
	}

	logger := watermill.NopLogger{}
	s.pubSub = gochannel.NewGoChannel(gochannel.Config{}, logger)
	poison, err := wmmiddleware.PoisonQueueWithFilter(s.pubSub, "poison", idempotency.IsPoison)
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{topicA, topicB} {
		router.AddHandler(topic, topic, s.pubSub, "receipts", s.pubSub, s.order).AddMiddleware(poison, orders.Middleware)
	}
	router.AddConsumerHandler(topicShipments, topicShipments, s.pubSub, outbox.Handler(
		func(tx *sqloutbox.PgxTx, msg *message.Message) error {
			return tx.Publish("shipped", message.NewMessage(watermill.NewUUID(), msg.Payload))
		})).AddMiddleware(poison, shipments.Middleware)
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	t.Cleanup(func() {
		s.mu.Lock()
		for _, ch := range s.held {
			close(ch)
		}
		s.held = map[string]chan struct{}{}
		s.mu.Unlock()
		_ = router.Close()
		_ = s.pubSub.Close()
	})
	return s
}

// order is the orders handler. Metadata "do" says what it does on its
// first run for a key: "" succeeds with a receipt, "fail" fails, "reject"
// fails for good (idempotency.Permanent), "hold" waits until the test
// lets it go, "lose" waits until its lease is lost.
// Later runs succeed.
func (s *service) order(msg *message.Message) ([]*message.Message, error) {
	key := msg.Metadata.Get("key")
	s.mu.Lock()
	s.runs[key]++
	first := s.runs[key] == 1
	var hold chan struct{}
	if first && msg.Metadata.Get("do") == "hold" {
		hold = make(chan struct{})
		s.held[key] = hold
	}
	s.mu.Unlock()
	if first {
		switch msg.Metadata.Get("do") {
		case "fail":
			return nil, errors.New("payment gateway timeout")
		case "reject":
			return nil, idempotency.Permanent(errors.New("unknown product"))
		case "hold":
			s.started <- key
			select {
			case <-hold:
			case <-msg.Context().Done():
				return nil, msg.Context().Err()
			}
		case "lose":
			s.started <- key
			<-msg.Context().Done()
			return nil, context.Cause(msg.Context())
		}
	}
	return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("receipt for "+key))}, nil
}

// let lets the handler holding key go on.
func (s *service) let(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.held[key]; ok {
		close(ch)
		delete(s.held, key)
	}
}

// publish publishes a message with the given key (none if empty) and
// what the handler does with it.
func (s *service) publish(topic, key, do string) {
	s.t.Helper()
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"key":"`+key+`"}`))
	if key != "" {
		msg.Metadata.Set("key", key)
	}
	if do != "" {
		msg.Metadata.Set("do", do)
	}
	if err := s.pubSub.Publish(topic, msg); err != nil {
		s.t.Fatal(err)
	}
}

// waitUntil waits until cond holds, for up to two minutes.
func (s *service) waitUntil(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("waited two minutes for %s; outcomes so far: %v", what, s.counters.Snapshot())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *service) count(o idempotency.Outcome) int64 { return s.counters.Count(o) }

// drive runs the service through every outcome the pack watches, which
// p scrapes.
func (s *service) drive(p *promServer) {
	t, ctx := s.t, context.Background()

	// Processed, then duplicates (which replay the stored receipts).
	for i := range 20 {
		s.publish(topicA, fmt.Sprintf("o%d", i), "")
	}
	s.waitUntil("20 processed", func() bool { return s.count(idempotency.OutcomeProcessed) >= 20 })
	for i := range 5 {
		s.publish(topicB, fmt.Sprintf("o%d", i), "")
	}
	s.waitUntil("5 duplicates", func() bool { return s.count(idempotency.OutcomeDuplicate) >= 5 })

	// A handler that fails once, and runs again on the redelivery.
	s.publish(topicA, "f1", "fail")
	s.waitUntil("a failed handler", func() bool { return s.count(idempotency.OutcomeHandlerFailed) >= 1 })

	// A duplicate of a key in progress: it waits, is nacked, comes back,
	// waits again... until the holder is let go and completes.
	s.publish(topicA, "h1", "hold")
	if key := <-s.started; key != "h1" {
		t.Fatalf("%s started, want h1", key)
	}
	s.publish(topicB, "h1", "")
	s.waitUntil("25 in-progress nacks", func() bool { return s.count(idempotency.OutcomeInProgress) >= 25 })
	s.let("h1")
	s.waitUntil("the waiting duplicate of h1", func() bool { return s.count(idempotency.OutcomeDuplicate) >= 6 })

	// A holder that crashed: nobody renews its lease, the next delivery
	// takes it over when it runs out.
	if _, err := s.store.Acquire(ctx, backends.AcquireRequest{Key: nsOrders + ":t1", Owner: "crashed-worker", LeaseTTL: time.Second, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	s.publish(topicB, "t1", "")
	s.waitUntil("a takeover", func() bool { return s.counters.Takeovers() >= 1 })

	// A lease lost while the handler runs: an operator deletes its record.
	s.publish(topicA, "l1", "lose")
	if key := <-s.started; key != "l1" {
		t.Fatalf("%s started, want l1", key)
	}
	if err := s.store.Delete(ctx, nsOrders+":l1"); err != nil {
		t.Fatal(err)
	}
	s.waitUntil("a lost lease", func() bool { return s.count(idempotency.OutcomeLeaseLost) >= 1 })

	// The store refuses a completion for good: processed, not recorded.
	s.faults.mu.Lock()
	s.faults.refuseCompletion[nsOrders+":n1"] = true
	s.faults.mu.Unlock()
	s.publish(topicA, "n1", "")
	s.waitUntil("a completion not recorded", func() bool { return s.count(idempotency.OutcomeProcessedNotRecorded) >= 1 })

	// The store refuses an Acquire, for as long as it takes Prometheus to
	// see the store errors rise between two scrapes (as in an outage, not
	// a blip within one scrape interval, which no rate() sees); then the
	// message is processed.
	s.faults.mu.Lock()
	s.faults.refuseAcquire[nsOrders+":s1"] = true
	s.faults.mu.Unlock()
	s.publish(topicB, "s1", "")
	storeErrors := func() float64 {
		res, err := p.query(`sum(watermill_idempotency_deliveries_total{watermill_idempotency_outcome="store_error"})`)
		if err != nil || len(res) == 0 {
			return 0
		}
		return res[0].value()
	}
	var first float64
	s.waitUntil("Prometheus to scrape store errors", func() bool { first = storeErrors(); return first > 0 })
	s.waitUntil("Prometheus to scrape more store errors", func() bool { return storeErrors() > first })
	s.faults.mu.Lock()
	s.faults.refuseAcquire[nsOrders+":s1"] = false
	s.faults.mu.Unlock()
	s.waitUntil("s1 processed after the store errors", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.runs["s1"] == 1
	})

	// A message without a key, and one the handler rejects for good:
	// poison, taken by the poison queue.
	s.publish(topicA, "", "")
	s.waitUntil("a key error", func() bool { return s.count(idempotency.OutcomeKeyError) >= 1 })
	s.publish(topicA, "p1", "reject")
	s.waitUntil("a permanent failure", func() bool { return s.count(idempotency.OutcomeHandlerFailedPermanently) >= 1 })

	// Shipments through the outbox, which no Forwarder empties here; the
	// oldest has waited an hour.
	for i := range 3 {
		s.publish(topicShipments, fmt.Sprintf("s%d", i), "")
	}
	s.waitUntil("3 shipments written to the outbox", func() bool {
		var n int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.outboxRows).Scan(&n)
		return err == nil && n >= 3
	})
	if _, err := s.pool.Exec(ctx, `UPDATE `+s.outboxRows+` SET created_at = created_at - interval '1 hour' WHERE "offset" = (SELECT min("offset") FROM `+s.outboxRows+`)`); err != nil {
		t.Fatal(err)
	}

	// A lease held for long: a handler that is stuck (here, no handler).
	if _, err := s.store.Acquire(ctx, backends.AcquireRequest{Key: nsOrders + ":stuck", Owner: "stuck-worker", LeaseTTL: time.Hour, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
}
