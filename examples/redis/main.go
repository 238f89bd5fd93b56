// Command redis is the order-processing story on Redis Streams with the
// idempotency middleware and its Redis lease store.
//
// Two consumers share a consumer group and the lease store, each use of
// Redis with a client and a pool of its own, as in production: the stream
// and the leases (so lease keeping never waits behind other traffic). The
// producer sends every order twice (the same order_id under new message
// UUIDs); one order's handler fails once; the lease store refuses one
// order's first acquisitions; one order is slow enough that Redis Streams
// claims its entry for the other consumer while the first still runs.
// Every charge goes to a sink that refuses stale fencing tokens
// (examples/internal/story tells the same story on every broker).
//
// While it runs, it serves Prometheus metrics at /metrics: the
// middleware's OpenTelemetry metrics (contrib/otel) next to Watermill's
// router metrics. At the end it scrapes them and checks that they agree
// with what it saw, and that every order was charged exactly once; it exits
// non-zero if not.
//
// Configuration (environment): REDIS_ADDR (default 127.0.0.1:6379),
// METRICS_ADDR (default 127.0.0.1:0, a free port).
//
//	go run ./redis
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	examplemetrics "github.com/watermill-idempotency/idempotency/examples/internal/metrics"
	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := Config{RedisAddr: env("REDIS_ADDR", "127.0.0.1:6379"), MetricsAddr: env("METRICS_ADDR", "127.0.0.1:0"), Orders: 20}
	if _, err := Run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "redis example:", err)
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
	RedisAddr string
	// MetricsAddr is where /metrics is served while the run lasts.
	// Defaults to 127.0.0.1:0, a free port.
	MetricsAddr string
	// Orders is how many regular orders the producer sends, each twice.
	Orders int
	// Prefix keeps the run's stream, group and keys apart. Defaults to a
	// fresh one per run.
	Prefix string
}

// Report is what happened: the story's report and what /metrics said.
type Report struct {
	story.Report
	Scraped examplemetrics.Scraped
}

// Check verifies the story and that /metrics agrees with it.
func (r Report) Check() error {
	return errors.Join(r.Report.Check(), r.Scraped.Check(map[string]int64{
		"processed":      r.Outcomes[idempotency.OutcomeProcessed.String()],
		"duplicate":      r.Outcomes[idempotency.OutcomeDuplicate.String()],
		"handler_failed": r.Outcomes[idempotency.OutcomeHandlerFailed.String()],
		"store_error":    r.Outcomes[idempotency.OutcomeStoreError.String()],
	}, r.Published))
}

// Run runs the story and prints what happened to w, its verdict last.
func Run(ctx context.Context, cfg Config, w io.Writer) (Report, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = fmt.Sprintf("example-%d:", time.Now().UnixNano())
	}
	newClient := func() *redis.Client {
		return redis.NewClient(&redis.Options{Addr: cfg.RedisAddr, ContextTimeoutEnabled: true})
	}
	// The broker's and the lease store's clients.
	client, storeClient := newClient(), newClient()
	defer client.Close()
	defer storeClient.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		return Report{}, fmt.Errorf("redis at %s: %w", cfg.RedisAddr, err)
	}
	rs, err := redisstore.New(storeClient, redisstore.Options{Prefix: cfg.Prefix + "idem:"})
	if err != nil {
		return Report{}, err
	}
	defer rs.Close()
	// Metrics: the middleware's, through contrib/otel, and Watermill's
	// router metrics, at one /metrics endpoint.
	metrics, err := examplemetrics.Serve(cfg.MetricsAddr)
	if err != nil {
		return Report{}, err
	}
	defer metrics.Close()
	store, otelObserver, err := metrics.Instrument(rs)
	if err != nil {
		return Report{}, err
	}
	b, err := newBroker(client, cfg.Prefix)
	if err != nil {
		return Report{}, err
	}
	b.Observer, b.SetupRouter = otelObserver, metrics.AddRouterMetrics
	fmt.Fprintf(w, "Redis Streams at %s; metrics at %s while the run lasts\n", cfg.RedisAddr, metrics.URL)

	sr, err := story.Run(ctx, b, store, cfg.Orders, w)
	rep := Report{Report: sr}
	if err != nil {
		return rep, err
	}
	if rep.Scraped, err = metrics.Scrape(ctx); err != nil {
		return rep, err
	}
	fmt.Fprintf(w, "Scraped from /metrics: %s\n", rep.Scraped)
	fmt.Fprintln(w, "Summary: "+rep.String())
	if err := rep.Check(); err != nil {
		fmt.Fprintf(w, "Check FAILED: %v\n", err)
		return rep, err
	}
	fmt.Fprintf(w, "Check: %d orders charged once each through the fenced sink, the claimed slow order caught by its lease, the crashed consumer's order taken over, nothing poisoned, /metrics in agreement.\n", len(rep.Applied))
	return rep, nil
}

// Redis Streams claims an entry idle this long for another consumer, even
// while its first consumer still runs it: short here, so that the slow
// order (3s) is claimed while it runs.
const maxIdleTime = time.Second

// newBroker is Redis Streams as the story uses it: one stream, one
// consumer group. Each consumer's subscriber gets a client of its own, as
// a process of its own would: closing a watermill-redisstream subscriber
// closes its client.
func newBroker(client *redis.Client, prefix string) (story.Broker, error) {
	logger := watermill.NopLogger{}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, logger)
	if err != nil {
		return story.Broker{}, err
	}
	topic, group := prefix+"orders", prefix+"billing"
	return story.Broker{
		Name:      "Redis Streams",
		Publisher: pub,
		Topic:     topic,
		Subscriber: func(consumer string) (message.Subscriber, error) {
			return redisstream.NewSubscriber(redisstream.SubscriberConfig{
				Client:          redis.NewClient(client.Options()),
				Consumer:        consumer,
				ConsumerGroup:   group,
				OldestId:        "0",
				MaxIdleTime:     maxIdleTime,
				ClaimInterval:   100 * time.Millisecond,
				NackResendSleep: 100 * time.Millisecond,
				BlockTime:       100 * time.Millisecond,
			}, logger)
		},
		// About MaxIdleTime, a few times over: the lease is renewed every
		// third of it while the handler runs.
		Configure: func(c *idempotency.Config) { c.LeaseTTL = 3 * maxIdleTime },
		// A consumer reads what it claims on the channel it reads the
		// stream on, one entry at a time: one busy nacking a copy of the
		// slow order, as it would with a second copy from the producer,
		// handles the entry it claimed only once that copy is acked, after
		// the order ran. One copy leaves the other consumer free to claim
		// the holder's entry, idle past MaxIdleTime, while it still runs.
		SlowCopies:             1,
		SlowFor:                4 * time.Second,
		RedeliversWhileRunning: true,
	}, nil
}
