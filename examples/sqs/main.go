// Command sqs is an order-processing service on Amazon SQS (watermill-aws)
// with the idempotency middleware, its leases in Redis (or Postgres, or
// DynamoDB).
//
// It tells the story every broker's test tells (examples/internal/story).
// Two consumer instances receive from one queue. The producer sends every
// order twice (the same order_id under new message UUIDs). One order's
// handler fails once: watermill-aws's nack does nothing, the message comes
// back after the visibility timeout, and the retry charges it. The lease
// store refuses one order's first acquisitions. One order takes longer
// than the visibility timeout, and the producer retries it at once: its
// copies arrive while the first still runs. Instead of holding a worker,
// each such copy is nacked, and contrib/awssqs's Defer makes it visible
// again when the holder's lease runs out; by then the order is charged and
// the copy is dropped. Every charge goes to a sink that refuses stale
// fencing tokens.
//
// While it runs, it serves Prometheus metrics at /metrics: the
// middleware's OpenTelemetry metrics (contrib/otel) next to Watermill's
// router metrics. At the end it scrapes them and checks that they agree
// with what it saw.
//
// Configuration (environment): SQS_ENDPOINT (default http://localhost:4566,
// LocalStack), AWS_REGION (us-east-1), STORE or -store (redis, postgres or
// dynamodb), REDIS_ADDR (127.0.0.1:6379), DATABASE_URL (for the postgres
// store), DYNAMODB_ENDPOINT (for the dynamodb store; defaults to
// SQS_ENDPOINT, as LocalStack serves both), DYNAMODB_NO_TTL (set it for
// an emulator without TTL, such as dynalite), METRICS_ADDR (127.0.0.1:0, a
// free port).
//
//	go run ./sqs
//	go run ./sqs -store postgres
//	go run ./sqs -store dynamodb
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/contrib/awssqs"
	examplemetrics "github.com/watermill-idempotency/idempotency/examples/internal/metrics"
	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

func main() {
	store := flag.String("store", env("STORE", "redis"), "where the leases live: redis, postgres or dynamodb")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := Config{
		Endpoint:       env("SQS_ENDPOINT", "http://localhost:4566"),
		Region:         env("AWS_REGION", "us-east-1"),
		Store:          *store,
		RedisAddr:      env("REDIS_ADDR", "127.0.0.1:6379"),
		DatabaseURL:    env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		DynamoEndpoint: os.Getenv("DYNAMODB_ENDPOINT"),
		DynamoNoTTL:    os.Getenv("DYNAMODB_NO_TTL") != "",
		MetricsAddr:    env("METRICS_ADDR", "127.0.0.1:0"),
		Orders:         10,
	}
	if _, err := Run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sqs example:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Config configures a run.
type Config struct {
	Endpoint, Region string
	// Store is "redis", "postgres" or "dynamodb".
	Store                  string
	RedisAddr, DatabaseURL string
	// DynamoEndpoint is DynamoDB's endpoint, for the dynamodb store.
	// Defaults to Endpoint (LocalStack serves both).
	DynamoEndpoint string
	// DynamoNoTTL leaves TTL off on the store's table, for an emulator
	// without UpdateTimeToLive (dynalite).
	DynamoNoTTL bool
	// MetricsAddr is where /metrics is served while the run lasts.
	// Defaults to 127.0.0.1:0, a free port.
	MetricsAddr string
	// Orders is how many regular orders the producer sends (each twice).
	Orders int
	// Prefix keeps the run's queue and keys apart. Defaults to a fresh one.
	Prefix string
}

// The queue's visibility timeout: short, so that the slow order (3s) comes
// back while it runs.
const visibilityTimeout = 2 * time.Second

// Report is what happened: the story's report, the copies Defer deferred,
// and what /metrics said.
type Report struct {
	story.Report
	// Deferred counts the copies Defer made visible again later (its
	// successful ChangeMessageVisibility calls).
	Deferred int64
	Scraped  examplemetrics.Scraped
}

// Check verifies the story, that Defer deferred an in-flight copy, and
// that /metrics agrees.
func (r Report) Check() error {
	var errs []error
	errs = append(errs, r.Report.Check())
	if r.Deferred < 1 {
		errs = append(errs, errors.New("no copy in progress was deferred"))
	}
	counts := map[string]int64{}
	for _, o := range []idempotency.Outcome{idempotency.OutcomeProcessed, idempotency.OutcomeDuplicate,
		idempotency.OutcomeHandlerFailed, idempotency.OutcomeInProgress, idempotency.OutcomeStoreError} {
		counts[o.String()] = r.Outcomes[o.String()]
	}
	errs = append(errs, r.Scraped.Check(counts, r.Published))
	return errors.Join(errs...)
}

// Run runs the story and prints what happened to w, its verdict last.
func Run(ctx context.Context, cfg Config, w io.Writer) (Report, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = fmt.Sprintf("example-%d", time.Now().UnixNano())
	}
	plainStore, closeStore, err := openStore(ctx, cfg)
	if err != nil {
		return Report{}, err
	}
	defer closeStore()
	// Metrics: the middleware's, through contrib/otel, and Watermill's
	// router metrics, at one /metrics endpoint.
	metrics, err := examplemetrics.Serve(cfg.MetricsAddr)
	if err != nil {
		return Report{}, err
	}
	defer metrics.Close()
	store, otelObserver, err := metrics.Instrument(plainStore)
	if err != nil {
		return Report{}, err
	}
	var deferred atomic.Int64
	b, err := newBroker(ctx, cfg, &deferred)
	if err != nil {
		return Report{}, err
	}
	b.Observer, b.SetupRouter = otelObserver, metrics.AddRouterMetrics
	fmt.Fprintf(w, "SQS at %s, leases in %s; metrics at %s while the run lasts\n", cfg.Endpoint, cfg.Store, metrics.URL)

	sr, err := story.Run(ctx, b, store, cfg.Orders, w)
	rep := Report{Report: sr, Deferred: deferred.Load()}
	if err != nil {
		return rep, err
	}
	if rep.Scraped, err = metrics.Scrape(ctx); err != nil {
		return rep, err
	}
	fmt.Fprintf(w, "Scraped from /metrics: %s\n", rep.Scraped)
	fmt.Fprintf(w, "Summary: %s; Defer deferred %d in-flight copies\n", rep.String(), rep.Deferred)
	if err := rep.Check(); err != nil {
		fmt.Fprintf(w, "Check FAILED: %v\n", err)
		return rep, err
	}
	fmt.Fprintf(w, "Check: %d orders charged once each through the fenced sink, every message acked, in-flight copies deferred and dropped, the crashed consumer's order taken over, nothing poisoned, /metrics in agreement.\n", len(rep.Applied))
	return rep, nil
}

// newBroker is SQS as the story uses it: one queue read by both consumers
// with Defer in front of the middleware. deferred counts Defer's calls.
func newBroker(ctx context.Context, cfg Config, deferred *atomic.Int64) (story.Broker, error) {
	logger := watermill.NopLogger{}
	awsCfg := aws.Config{Region: cfg.Region, Credentials: credentials.NewStaticCredentialsProvider("example", "example", "")}
	endpoint := []func(*sqs.Options){func(o *sqs.Options) { o.BaseEndpoint = aws.String(cfg.Endpoint) }}
	queue := cfg.Prefix + "-orders"
	if err := createQueue(ctx, awsCfg, endpoint, queue); err != nil {
		return story.Broker{}, err
	}
	client := visibilityCounter{Client: sqs.NewFromConfig(awsCfg, endpoint...), n: deferred}
	deferrer, err := awssqs.NewDefer(awssqs.DeferConfig{Client: client})
	if err != nil {
		return story.Broker{}, err
	}
	pub, err := wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: awsCfg, OptFns: endpoint, DoNotCreateQueueIfNotExists: true}, logger)
	if err != nil {
		return story.Broker{}, err
	}
	return story.Broker{
		Name:      "SQS",
		Publisher: pub,
		Topic:     queue,
		Subscriber: func(string) (message.Subscriber, error) {
			return wsqs.NewSubscriber(wsqs.SubscriberConfig{
				AWSConfig:                   awsCfg,
				OptFns:                      endpoint,
				DoNotCreateQueueIfNotExists: true,
				ConsumeWorkers:              2,
				Unmarshaler:                 awssqs.Unmarshaler{}, // keeps the receipt handle for Defer
				GenerateReceiveMessageInput: func(ctx context.Context, url wsqs.QueueURL) (*sqs.ReceiveMessageInput, error) {
					in, err := wsqs.GenerateReceiveMessageInputDefault(ctx, url)
					if err == nil {
						in.WaitTimeSeconds = 1 // short long-polls, so the example stops quickly
					}
					return in, err
				},
			}, logger)
		},
		Middleware: []message.HandlerMiddleware{deferrer.Middleware},
		Configure: func(c *idempotency.Config) {
			// About the queue's visibility timeout: a crashed consumer's key
			// is free again when SQS brings its message back.
			c.LeaseTTL = visibilityTimeout
			// A copy whose key is held waits briefly, then is nacked and
			// deferred, instead of holding an SQS worker.
			c.InProgressWait = 200 * time.Millisecond
		},
		// Over twice the visibility timeout: SQS shows the slow order's
		// message again one visibility timeout after it was received, and
		// a consumer must then receive it (a long poll) while the order
		// still runs.
		SlowFor:                9 * visibilityTimeout / 4,
		RedeliversWhileRunning: true,
	}, nil
}

// visibilityCounter counts the visibility changes Defer makes.
type visibilityCounter struct {
	*sqs.Client
	n *atomic.Int64
}

func (c visibilityCounter) ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error) {
	out, err := c.Client.ChangeMessageVisibility(ctx, in, optFns...)
	if err == nil {
		c.n.Add(1)
	}
	return out, err
}

// createQueue creates the queue with a short visibility timeout. The
// example creates it itself: emulators do not all answer the SDK's typed
// "does not exist" error that auto-creation relies on.
func createQueue(ctx context.Context, cfg aws.Config, optFns []func(*sqs.Options), name string) error {
	client := sqs.NewFromConfig(cfg, optFns...)
	_, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName:  aws.String(name),
		Attributes: map[string]string{"VisibilityTimeout": strconv.Itoa(int(visibilityTimeout.Seconds()))},
	})
	if err != nil {
		return fmt.Errorf("create queue %s: %w", name, err)
	}
	return nil
}

func openStore(ctx context.Context, cfg Config) (backends.Store, func(), error) {
	switch cfg.Store {
	case "redis":
		client := redis.NewClient(&redis.Options{Addr: cfg.RedisAddr, ContextTimeoutEnabled: true})
		if err := client.Ping(ctx).Err(); err != nil {
			client.Close()
			return nil, nil, fmt.Errorf("redis at %s: %w", cfg.RedisAddr, err)
		}
		store, err := redisstore.New(client, redisstore.Options{Prefix: cfg.Prefix + ":idem:"})
		if err != nil {
			client.Close()
			return nil, nil, err
		}
		return store, func() { store.Close(); client.Close() }, nil
	case "postgres":
		pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
		if err != nil {
			return nil, nil, err
		}
		schema := strings.ReplaceAll(cfg.Prefix, "-", "_")
		store, err := pgstore.New(pool, pgstore.Options{Schema: schema})
		if err == nil {
			err = store.Migrate(ctx)
		}
		if err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("postgres at %s: %w", cfg.DatabaseURL, err)
		}
		return store, func() {
			pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) //nolint:errcheck
			pool.Close()
		}, nil
	case "dynamodb":
		return openDynamo(ctx, cfg)
	}
	return nil, nil, fmt.Errorf("STORE must be redis, postgres or dynamodb, got %q", cfg.Store)
}

// openDynamo opens the dynamodb store on a table of the run's own, created
// by the store's helper and deleted at the end.
func openDynamo(ctx context.Context, cfg Config) (backends.Store, func(), error) {
	endpoint := cfg.DynamoEndpoint
	if endpoint == "" {
		endpoint = cfg.Endpoint
	}
	client := dynamodb.New(dynamodb.Options{
		Region:       cfg.Region,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("example", "example", ""),
	})
	table := strings.ReplaceAll(cfg.Prefix, ":", "_") + "-idem"
	store, err := dynamostore.New(client, dynamostore.Options{Table: table})
	if err == nil {
		err = store.CreateTable(ctx, dynamostore.TableOptions{NoTTL: cfg.DynamoNoTTL})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("dynamodb at %s: %w", endpoint, err)
	}
	return store, func() {
		client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)}) //nolint:errcheck
	}, nil
}
