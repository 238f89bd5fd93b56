// Command kafka is an order service on Kafka (watermill-kafka) that
// charges every order at most once, however often Kafka delivers it: the
// idempotency middleware takes a lease on the order's id before the
// handler runs, in Redis, and the handler writes the charge with the
// lease's fencing token to a ledger that refuses a stale one.
//
// Kafka has no per-message nack: watermill-kafka retries a nacked message
// in place, and its partition waits meanwhile. A copy that finds its order
// being charged from another partition waits in the middleware for up to
// inProgressWait, holding its partition, then is nacked and retried.
// Duplicates come from producer retries and from rebalances: a member busy
// in a handler past the rebalance timeout is evicted, and another member
// reads its partition again from the last committed offset while the first
// delivery still runs.
//
// main.go is the service, top to bottom: Kafka (in process unless
// KAFKA_BROKERS is set), /metrics, the lease store, the middleware, the
// router and its middleware, the handler, graceful shutdown. ledger.go is
// the business store (in Redis), payments.go a stand-in for a payment
// provider. demo.go is the demonstration, apart from the service: a
// producer that sends every order twice, each copy to its own partition,
// an order whose payment fails, a slow order and a message without an
// order id; a second copy of the service (run again, in the same process)
// that joins the consumer group while the slow order is charged, as a
// deploy or a scale-out would; and the check of what happened. Run with
// -serve, the service runs alone until SIGINT or SIGTERM.
//
// Configuration (environment):
//
//	KAFKA_BROKERS  comma-separated (default: none, and Kafka runs in process: franz-go's kfake)
//	REDIS_ADDR     the Redis of the leases and the ledger (default 127.0.0.1:6379)
//	METRICS_ADDR   where /metrics listens (default 127.0.0.1:0: a free port; the URL is printed)
//	PREFIX         prepended to every topic, group and key name (default demo-<unix nanoseconds>-,
//	               fresh for each run; give copies of the service the same one)
//
// Usage:
//
//	go run ./kafka          # the demo: exits non-zero if one of its claims is false
//	go run ./kafka -serve   # the service alone
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/components/metrics"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/contrib/idemotel"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

const (
	// partitions is the orders topic's: messages on different partitions
	// are handled at once, those on one partition one at a time.
	partitions = 2
	// rebalanceTimeout is how long the group's coordinator waits for its
	// members to rejoin a rebalance before it evicts them. Sarama rejoins
	// only once every running handler has returned, so a member busy
	// longer is evicted and its partitions read again from the last
	// committed offset (docs/brokers.md). Short here, so that a deploy or
	// scale-out shows it within seconds; Sarama's default is 60s.
	rebalanceTimeout = time.Second
	// sessionTimeout is how long the coordinator waits for a silent
	// member (a dead process) before it hands its partitions to others.
	sessionTimeout = 10 * time.Second
	// leaseTTL is about the session timeout: when a member dies holding
	// an order, its lease has run out about when its partition moves on.
	// The lease is renewed every third of it while the handler runs.
	leaseTTL = sessionTimeout
	// inProgressWait is how long a copy of an order held elsewhere may
	// hold its partition, waiting, before it is nacked and retried in
	// place.
	inProgressWait = time.Second
)

type config struct {
	brokers     string
	redisAddr   string
	metricsAddr string
	prefix      string
}

func main() {
	serveOnly := flag.Bool("serve", false, "run the service alone, until SIGINT or SIGTERM: no demo orders, no check")
	flag.Parse()
	cfg := config{
		brokers:     os.Getenv("KAFKA_BROKERS"),
		redisAddr:   env("REDIS_ADDR", "127.0.0.1:6379"),
		metricsAddr: env("METRICS_ADDR", "127.0.0.1:0"),
		prefix:      env("PREFIX", fmt.Sprintf("demo-%d-", time.Now().UnixNano())),
	}
	// SIGINT and SIGTERM shut the service down gracefully: the router
	// stops taking messages and waits for the running handlers.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, cfg, !*serveOnly)
	stop()
	if err != nil {
		fmt.Println("kafka example:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// run runs the service until ctx ends, or withDemo until the demo's
// messages are settled, then shuts it down gracefully.
func run(ctx context.Context, cfg config, withDemo bool) error {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{ReplaceAttr: withoutTime}))
	// Watermill's info lines (subscribing, starting a handler) are debug
	// here; its warnings and errors are logged.
	wmLogger := watermill.NewSlogLoggerWithLevelMapping(logger, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
	topic, poisonTopic, group := cfg.prefix+"orders", cfg.prefix+"orders-poison", cfg.prefix+"billing"

	brokers := strings.Split(cfg.brokers, ",")
	if cfg.brokers == "" {
		// No Kafka given: one in process, franz-go's kfake, reachable by
		// this process alone.
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return err
		}
		defer cluster.Close()
		brokers = cluster.ListenAddrs()
		logger.Info("no KAFKA_BROKERS: Kafka runs in process (kfake)", "brokers", strings.Join(brokers, ","))
	}

	// /metrics: the middleware's OpenTelemetry metrics, through the
	// Prometheus exporter, next to Watermill's router metrics.
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return err
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer meters.Shutdown(context.Background()) //nolint:errcheck // nothing is pushed anywhere
	metricsURL, stopMetrics, err := serveMetrics(cfg.metricsAddr, registry)
	if err != nil {
		return err
	}
	defer stopMetrics()
	logger.Info("serving /metrics", "url", metricsURL)

	// The lease store, its calls timed on /metrics. Redis: a client for
	// the leases alone, so that their keeping never waits behind other
	// traffic.
	storeClient := redis.NewClient(&redis.Options{Addr: cfg.redisAddr, ContextTimeoutEnabled: true})
	defer storeClient.Close()
	if err := storeClient.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", cfg.redisAddr, err)
	}
	leases, err := redisstore.New(storeClient, redisstore.Options{Prefix: cfg.prefix + "idem:"})
	if err != nil {
		return err
	}
	defer leases.Close()
	store, err := idemotel.InstrumentStore(leases, idemotel.StoreConfig{MeterProvider: meters})
	if err != nil {
		return err
	}
	deliveries, err := idemotel.NewObserver(idemotel.Config{MeterProvider: meters})
	if err != nil {
		return err
	}

	// The idempotency middleware: one lease per order id.
	idem, err := idempotency.New(idempotency.Config{
		Store:    store,
		Key:      keyfunc.JSONField("order_id"),
		LeaseTTL: leaseTTL,
		Timing:   idempotency.Timing{InProgressWait: inProgressWait},
		Observer: idempotency.MultiObserver(deliveries, logDeliveries(logger)),
	})
	if err != nil {
		return err
	}

	// Only messages that can never succeed go to the poison topic: no
	// usable order id, for one. A duplicate whose key is in progress, a store error or
	// a lost lease is nacked and retried.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}}, wmLogger)
	if err != nil {
		return err
	}
	defer pub.Close()
	poisonQueue, err := middleware.PoisonQueueWithFilter(pub, poisonTopic, idempotency.IsPoison)
	if err != nil {
		return err
	}
	retry := middleware.Retry{MaxRetries: 2, InitialInterval: 100 * time.Millisecond, Multiplier: 2, Logger: wmLogger,
		ShouldRetry: idempotency.ShouldRetry} // never retries what cannot succeed (idempotency.Permanent)

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, wmLogger)
	if err != nil {
		return err
	}
	metrics.NewPrometheusMetricsBuilder(registry, "", "").AddPrometheusRouterMetrics(router)
	router.AddMiddleware(
		poisonQueue,          // outermost: sees what the middleware says can never succeed
		idem.Middleware,      // one lease for the whole delivery, retries included
		retry.Middleware,     // retries the handler within that lease
		middleware.Recoverer, // a panic becomes an error: retried, then the lease released
	)

	// The handler: charges the order, with the lease's fencing token on
	// the ledger's write, and counts its attempts on /metrics.
	ledgerClient := redis.NewClient(&redis.Options{Addr: cfg.redisAddr, ContextTimeoutEnabled: true})
	defer ledgerClient.Close()
	ledger := &ledger{client: ledgerClient, prefix: cfg.prefix + "ledger:"}
	payments := &fakePayments{}
	attempts, err := chargeAttempts(registry)
	if err != nil {
		return err
	}
	chargeOrder := func(msg *message.Message) error {
		var order order
		if err := json.Unmarshal(msg.Payload, &order); err != nil {
			return idempotency.Permanent(err) // no redelivery will parse it: to the poison queue
		}
		lease, ok := idempotency.LeaseFromContext(msg.Context())
		if !ok {
			return errors.New("no lease: the idempotency middleware does not run before this handler")
		}
		logger.Info("charging", "order", order.ID, "amount_cents", order.AmountCents, "fencing_token", lease.Token)
		err := payments.charge(msg.Context(), order)
		if err == nil {
			err = ledger.record(msg.Context(), order, lease.Token)
		}
		if err != nil {
			attempts.WithLabelValues("failed").Inc()
			return err
		}
		attempts.WithLabelValues("charged").Inc()
		return nil
	}

	saramaCfg := kafka.DefaultSaramaSubscriberConfig()
	saramaCfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	saramaCfg.Consumer.Group.Rebalance.Timeout = rebalanceTimeout
	saramaCfg.Consumer.Group.Session.Timeout = sessionTimeout
	// An evicted member learns it at its next heartbeat, and stops taking
	// messages from the partitions it lost.
	saramaCfg.Consumer.Group.Heartbeat.Interval = 200 * time.Millisecond
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		ConsumerGroup:         group,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: saramaCfg,
		// A nacked message is retried in place after this pause; its
		// partition waits meanwhile.
		NackResendSleep: 100 * time.Millisecond,
		// The topics, if they do not exist: set your cluster's
		// replication factor.
		InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1},
	}, wmLogger)
	if err != nil {
		return err
	}
	for _, t := range []string{topic, poisonTopic} {
		if err := sub.SubscribeInitialize(t); err != nil {
			return fmt.Errorf("creating topic %s: %w", t, err)
		}
	}
	router.AddConsumerHandler("charge-order", topic, sub, chargeOrder)

	// The demo (demo.go) produces its messages once the router runs, and
	// ends runCtx once they are settled, as SIGTERM would.
	runCtx := ctx
	var d *demo
	if withDemo {
		if d, runCtx, err = startDemo(ctx, cfg, brokers, router.Running(), metricsURL, logger); err != nil {
			return err
		}
	}
	go func() {
		select {
		case <-router.Running():
			logger.Info("consuming", "topic", topic, "group", group)
		case <-runCtx.Done():
		}
	}()
	if err := router.Run(runCtx); err != nil {
		return err
	}
	logger.Info("shut down: no handler running")
	if d != nil {
		return d.verdict(ctx)
	}
	return nil
}

// order is what the orders topic carries.
type order struct {
	ID          string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	// Simulate asks the stand-in payment provider to misbehave: "slow" or
	// "flaky" (payments.go). The demo sets it.
	Simulate string `json:"simulate,omitempty"`
}

// chargeAttempts registers the handler's counter of its attempts, by
// result: charged, or failed (the payment or the ledger's write).
func chargeAttempts(registry *prometheus.Registry) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orders_charge_attempts_total",
		Help: "The handler's attempts to charge an order, by result: charged, or failed.",
	}, []string{"result"})
	if err := registry.Register(c); err != nil {
		return nil, err
	}
	return c, nil
}

// logDeliveries logs every delivery the middleware did not settle as a
// matter of course: a plain charge or duplicate is counted on /metrics,
// not logged.
func logDeliveries(logger *slog.Logger) idempotency.Observer {
	return idempotency.ObserverFunc(func(_ context.Context, ev idempotency.Event) {
		if (ev.Outcome == idempotency.OutcomeProcessed && !ev.Lease.Takeover) ||
			(ev.Outcome == idempotency.OutcomeDuplicate && ev.Waited == 0) {
			return
		}
		attrs := []any{"outcome", ev.Outcome.String(), "key", ev.Key, "message_uuid", ev.MessageUUID}
		if ev.Lease.Token != 0 {
			attrs = append(attrs, "fencing_token", ev.Lease.Token, "takeover", ev.Lease.Takeover)
		}
		if ev.Waited > 0 {
			attrs = append(attrs, "waited", ev.Waited.Round(time.Millisecond))
		}
		if ev.Err != nil {
			attrs = append(attrs, "err", ev.Err)
		}
		logger.Info("delivery", attrs...)
	})
}

// serveMetrics serves registry at /metrics on addr until stopped, and
// returns its URL.
func serveMetrics(addr string, registry *prometheus.Registry) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("metrics at %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
	return "http://" + ln.Addr().String() + "/metrics", stop, nil
}

// withoutTime drops the time from log lines: they are read in order.
func withoutTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
