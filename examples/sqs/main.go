// Command sqs is an order service on Amazon SQS (watermill-aws) that
// charges every order at most once, however often SQS delivers it: the
// idempotency middleware takes a lease on the order's id before the
// handler runs, in Redis, Postgres or DynamoDB, and the handler writes the
// charge with the lease's fencing token to a ledger that refuses a stale
// one. A copy that arrives while its order is being charged elsewhere is
// nacked, and contrib/awssqs's Defer makes it visible again when the
// holder's lease runs out, instead of holding a worker.
//
// main.go is the service, top to bottom: the queues, /metrics, the lease
// store, the middleware, the router and its middleware, the handler,
// graceful shutdown. ledger.go is the business store (in Redis),
// payments.go a stand-in for a payment provider. demo.go is the
// demonstration, apart from the service: a producer that sends every order
// twice, an order whose payment fails, a slow order sent twice at once and
// a message without an order id, and the check of what happened. Run with
// -serve, the service runs alone until SIGINT or SIGTERM.
//
// Configuration (environment):
//
//	SQS_ENDPOINT       SQS (default http://localhost:4566, LocalStack)
//	AWS_REGION         the region (default us-east-1); credentials are static, for emulators
//	STORE or -store    where the leases live: redis (default), postgres or dynamodb
//	REDIS_ADDR         the Redis of the ledger, and of the leases with STORE=redis (default 127.0.0.1:6379)
//	DATABASE_URL       the Postgres of the leases with STORE=postgres
//	                   (default postgres://postgres@127.0.0.1:5432/test?sslmode=disable)
//	DYNAMODB_ENDPOINT  DynamoDB, with STORE=dynamodb (default SQS_ENDPOINT: LocalStack serves both)
//	DYNAMODB_TTL       on (default): turn on the table's Time to Live; untouched: leave it
//	                   alone, for an emulator without it (dynalite)
//	METRICS_ADDR       where /metrics listens (default 127.0.0.1:0: a free port; the URL is printed)
//	PREFIX             prepended to every queue, table, schema and key name (default demo-<unix
//	                   nanoseconds>-, fresh for each run; give copies of the service the same one)
//
// Usage:
//
//	go run ./sqs                  # the demo: exits non-zero if one of its claims is false
//	go run ./sqs -store postgres
//	go run ./sqs -serve           # the service alone
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/components/metrics"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/contrib/awssqs"
	"github.com/watermill-idempotency/idempotency/contrib/idemotel"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// visibilityTimeout is the queue's: SQS shows a received message again
// after it, even while its handler still runs. Short here, so that the
// demo's slow order comes back while it runs.
const visibilityTimeout = 2 * time.Second

type config struct {
	endpoint, region string
	store            string // redis, postgres or dynamodb
	redisAddr        string
	databaseURL      string
	dynamoEndpoint   string
	dynamoTTL        dynamostore.TTL
	metricsAddr      string
	prefix           string
}

func main() {
	store := flag.String("store", env("STORE", "redis"), "where the leases live: redis, postgres or dynamodb")
	serveOnly := flag.Bool("serve", false, "run the service alone, until SIGINT or SIGTERM: no demo orders, no check")
	flag.Parse()
	ttl := env("DYNAMODB_TTL", "on")
	if ttl != "on" && ttl != "untouched" {
		fmt.Printf("sqs example: DYNAMODB_TTL is %q: want on or untouched\n", ttl)
		os.Exit(2)
	}
	cfg := config{
		endpoint:       env("SQS_ENDPOINT", "http://localhost:4566"),
		region:         env("AWS_REGION", "us-east-1"),
		store:          *store,
		redisAddr:      env("REDIS_ADDR", "127.0.0.1:6379"),
		databaseURL:    env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		dynamoEndpoint: env("DYNAMODB_ENDPOINT", env("SQS_ENDPOINT", "http://localhost:4566")),
		metricsAddr:    env("METRICS_ADDR", "127.0.0.1:0"),
		dynamoTTL:      map[string]dynamostore.TTL{"on": dynamostore.TTLOn, "untouched": dynamostore.TTLUntouched}[ttl],
		prefix:         env("PREFIX", fmt.Sprintf("demo-%d-", time.Now().UnixNano())),
	}
	// SIGINT and SIGTERM shut the service down gracefully: the router
	// stops taking messages and waits for the running handlers.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, cfg, !*serveOnly)
	stop()
	if err != nil {
		fmt.Println("sqs example:", err)
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
	queue, poisonQueue := cfg.prefix+"orders", cfg.prefix+"orders-poison"

	// SQS, with static credentials for an emulator; use the SDK's default
	// chain (config.LoadDefaultConfig) against AWS.
	awsCfg := aws.Config{Region: cfg.region, Credentials: credentials.NewStaticCredentialsProvider("example", "example", "")}
	endpoint := []func(*sqs.Options){func(o *sqs.Options) { o.BaseEndpoint = aws.String(cfg.endpoint) }}
	sqsClient := sqs.NewFromConfig(awsCfg, endpoint...)
	if err := createQueues(ctx, sqsClient, queue, poisonQueue); err != nil {
		return err
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

	// The lease store, its calls timed on /metrics.
	leases, closeLeases, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeLeases()
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
		Store: store,
		Key:   keyfunc.JSONField("order_id"),
		// About the visibility timeout: when a consumer dies holding an
		// order, its lease has run out when SQS shows the message again.
		// The lease is renewed every third of it while the handler runs.
		LeaseTTL: visibilityTimeout,
		// A copy whose order is held elsewhere waits briefly, then is
		// nacked and deferred (below), instead of holding a worker.
		Timing:   idempotency.Timing{InProgressWait: 200 * time.Millisecond},
		Observer: idempotency.MultiObserver(deliveries, logDeliveries(logger)),
	})
	if err != nil {
		return err
	}
	// watermill-aws's nack does nothing: a nacked message comes back after
	// the visibility timeout. Defer makes a copy whose order is in progress visible again
	// when the holder's lease runs out instead. Each deferral is logged.
	deferrer, err := awssqs.NewDefer(awssqs.DeferConfig{
		Client: sqsClient,
		Logger: watermill.NewSlogLoggerWithLevelMapping(logger, map[slog.Level]slog.Level{slog.LevelDebug: slog.LevelInfo}),
	})
	if err != nil {
		return err
	}

	// Only messages that can never succeed go to the poison queue: no
	// usable order id, for one. A duplicate whose key is in progress, a store error or
	// a lost lease is nacked and comes back.
	pub, err := wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: awsCfg, OptFns: endpoint, DoNotCreateQueueIfNotExists: true}, wmLogger)
	if err != nil {
		return err
	}
	defer pub.Close()
	poison, err := middleware.PoisonQueueWithFilter(pub, poisonQueue, idempotency.IsPoison)
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
		poison,               // outermost: sees what the middleware says can never succeed
		deferrer.Middleware,  // takes the receipt handle out before any handler sees it
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

	sub, err := wsqs.NewSubscriber(wsqs.SubscriberConfig{
		AWSConfig:                   awsCfg,
		OptFns:                      endpoint,
		DoNotCreateQueueIfNotExists: true,
		ConsumeWorkers:              2,                    // messages handled at once
		Unmarshaler:                 awssqs.Unmarshaler{}, // keeps the receipt handle for Defer
		GenerateReceiveMessageInput: func(ctx context.Context, url wsqs.QueueURL) (*sqs.ReceiveMessageInput, error) {
			in, err := wsqs.GenerateReceiveMessageInputDefault(ctx, url)
			if err == nil {
				in.WaitTimeSeconds = 1 // short long polls: a graceful shutdown waits for them
			}
			return in, err
		},
	}, wmLogger)
	if err != nil {
		return err
	}
	router.AddConsumerHandler("charge-order", queue, sub, chargeOrder)

	// The demo (demo.go) produces its messages once the router runs, and
	// ends runCtx once they are settled, as SIGTERM would.
	runCtx := ctx
	var d *demo
	if withDemo {
		if d, runCtx, err = startDemo(ctx, cfg, awsCfg, endpoint, router.Running(), metricsURL, logger); err != nil {
			return err
		}
	}
	go func() {
		select {
		case <-router.Running():
			logger.Info("consuming", "queue", queue, "leases", cfg.store)
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

// createQueues creates the queue, with the visibility timeout the lease
// TTL is set for, and the poison queue, unless they exist.
func createQueues(ctx context.Context, client *sqs.Client, queue, poisonQueue string) error {
	for name, attrs := range map[string]map[string]string{
		queue:       {"VisibilityTimeout": strconv.Itoa(int(visibilityTimeout.Seconds()))},
		poisonQueue: nil,
	} {
		if _, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs}); err != nil {
			return fmt.Errorf("creating queue %s: %w", name, err)
		}
	}
	return nil
}

// openStore opens the lease store cfg names, creating its table or
// schema if it does not exist.
func openStore(ctx context.Context, cfg config) (backends.Store, func(), error) {
	switch cfg.store {
	case "redis":
		client := redis.NewClient(&redis.Options{Addr: cfg.redisAddr, ContextTimeoutEnabled: true})
		store, err := redisstore.New(client, redisstore.Options{Prefix: cfg.prefix + "idem:"})
		if err == nil {
			err = client.Ping(ctx).Err()
		}
		if err != nil {
			client.Close()
			return nil, nil, fmt.Errorf("redis at %s: %w", cfg.redisAddr, err)
		}
		return store, func() { store.Close(); client.Close() }, nil
	case "postgres":
		pool, err := pgxpool.New(ctx, cfg.databaseURL)
		if err != nil {
			return nil, nil, err
		}
		store, err := pgstore.New(pool, pgstore.Options{Schema: postgresSchema(cfg.prefix)})
		if err == nil {
			err = store.Migrate(ctx)
		}
		if err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("postgres: %w", err)
		}
		return store, func() { store.Close(); pool.Close() }, nil
	case "dynamodb":
		client := dynamodb.New(dynamodb.Options{
			Region:       cfg.region,
			BaseEndpoint: aws.String(cfg.dynamoEndpoint),
			Credentials:  credentials.NewStaticCredentialsProvider("example", "example", ""),
		})
		opts := dynamostore.Options{Table: cfg.prefix + "idem", TTL: cfg.dynamoTTL}
		store, err := dynamostore.New(client, opts)
		if err == nil {
			err = store.Migrate(ctx)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("dynamodb at %s: %w", cfg.dynamoEndpoint, err)
		}
		return store, func() {}, nil
	}
	return nil, nil, fmt.Errorf("STORE must be redis, postgres or dynamodb, not %q", cfg.store)
}

// postgresSchema is the Postgres store's schema: the prefix as an
// identifier.
func postgresSchema(prefix string) string {
	return strings.ToLower(strings.NewReplacer("-", "_", ":", "_", ".", "_").Replace(prefix)) + "idem"
}

// order is what the orders queue carries.
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
