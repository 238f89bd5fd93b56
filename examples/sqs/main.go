// Command sqs is an order-processing service on Amazon SQS (watermill-aws)
// with the idempotency middleware, its leases in Redis (or Postgres).
//
// Two consumer instances receive from one queue. A producer sends order
// events with the duplicates real producers make (the same order_id under
// new message UUIDs). One order's handler fails once: watermill-aws's nack
// does nothing, the message comes back after the visibility timeout, and
// the retry charges it. One order takes longer than the visibility
// timeout, and the producer retries it at once: its copies arrive while
// the first still runs. Instead of holding a worker, each such copy is
// nacked, and contrib/awssqs's Defer makes it visible again when the
// holder's lease runs out; by then the order is charged and the copy is
// dropped.
//
// Configuration (environment): SQS_ENDPOINT (default http://localhost:4566,
// LocalStack), AWS_REGION (us-east-1), STORE or -store (redis or postgres),
// REDIS_ADDR (127.0.0.1:6379), DATABASE_URL (for the postgres store).
//
//	go run ./sqs
//	go run ./sqs -store postgres
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/contrib/awssqs"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

func main() {
	store := flag.String("store", env("STORE", "redis"), "where the leases live: redis or postgres")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := Config{
		Endpoint:    env("SQS_ENDPOINT", "http://localhost:4566"),
		Region:      env("AWS_REGION", "us-east-1"),
		Store:       *store,
		RedisAddr:   env("REDIS_ADDR", "127.0.0.1:6379"),
		DatabaseURL: env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		Orders:      10,
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
	// Store is "redis" or "postgres".
	Store                  string
	RedisAddr, DatabaseURL string
	// Orders is how many regular orders the producer sends (each twice).
	Orders int
	// Prefix keeps the run's queue and keys apart. Defaults to a fresh one.
	Prefix string
}

const (
	slowOrder         = "order-slow"  // takes longer than the visibility timeout
	flakyOrder        = "order-flaky" // the payment gateway fails the first attempt
	visibilityTimeout = 2 * time.Second
	slowFor           = 3 * time.Second
)

// Report is what happened.
type Report struct {
	Published, Orders   int
	ChargesPerOrder     map[string]int
	Processed           int64
	Duplicates          int64
	DuplicatesAfterWait int64
	FailedAttempts      int64
	// SlowOrderDeliveries counts deliveries of the slow order's messages.
	SlowOrderDeliveries int64
	// SlowOrderCaught: a copy of the slow order was dropped as a duplicate
	// instead of charging again.
	SlowOrderCaught bool
	// Deferred counts the copies Defer made visible again later (its
	// successful ChangeMessageVisibility calls).
	Deferred int64
}

// Check verifies the report: every order charged exactly once, nothing lost.
func (r Report) Check() error {
	var errs []error
	if len(r.ChargesPerOrder) != r.Orders {
		errs = append(errs, fmt.Errorf("%d of %d orders charged", len(r.ChargesPerOrder), r.Orders))
	}
	for order, n := range r.ChargesPerOrder {
		if n != 1 {
			errs = append(errs, fmt.Errorf("order %s charged %d times", order, n))
		}
	}
	if r.FailedAttempts != 1 {
		errs = append(errs, fmt.Errorf("%d failed attempts, want the flaky order's one", r.FailedAttempts))
	}
	if r.SlowOrderDeliveries < 2 || !r.SlowOrderCaught {
		errs = append(errs, fmt.Errorf("the slow order was delivered %d times and no copy of it was caught", r.SlowOrderDeliveries))
	}
	if r.Deferred < 1 {
		errs = append(errs, errors.New("no copy in progress was deferred"))
	}
	return errors.Join(errs...)
}

// Run runs the story and prints what happened to w.
func Run(ctx context.Context, cfg Config, w io.Writer) (Report, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = fmt.Sprintf("example-%d", time.Now().UnixNano())
	}
	logger := watermill.NopLogger{}
	store, closeStore, err := openStore(ctx, cfg)
	if err != nil {
		return Report{}, err
	}
	defer closeStore()

	awsCfg := aws.Config{Region: cfg.Region, Credentials: credentials.NewStaticCredentialsProvider("example", "example", "")}
	endpoint := []func(*sqs.Options){func(o *sqs.Options) { o.BaseEndpoint = aws.String(cfg.Endpoint) }}
	queue := cfg.Prefix + "-orders"
	if err := createQueue(ctx, awsCfg, endpoint, queue); err != nil {
		return Report{}, err
	}

	// The routers are closed, and wait for their handlers, before the
	// summary is printed: nothing runs after it. Closing twice is harmless.
	var routers []*message.Router
	closeAll := func() error {
		var errs []error
		for _, r := range routers {
			errs = append(errs, r.Close())
		}
		return errors.Join(errs...)
	}
	defer closeAll() //nolint:errcheck // already closed, or the run failed anyway

	var (
		mu          sync.Mutex
		rep         = Report{Orders: cfg.Orders + 2}
		charges     = map[string]int{}
		flakyFailed atomic.Bool
		inFlight    atomic.Int64
		acked       atomic.Int64
		deferred    atomic.Int64
	)
	sqsClient := visibilityCounter{Client: sqs.NewFromConfig(awsCfg, endpoint...), n: &deferred}
	deferrer, err := awssqs.NewDefer(awssqs.DeferConfig{Client: sqsClient})
	if err != nil {
		return Report{}, err
	}
	track := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			inFlight.Add(1)
			defer inFlight.Add(-1)
			return h(msg)
		}
	}
	observer := func(consumer string) idempotency.Observer {
		return idempotency.ObserverFunc(func(_ context.Context, ev idempotency.Event) {
			mu.Lock()
			defer mu.Unlock()
			order := strings.TrimPrefix(ev.Key, "charge:")
			what := fmt.Sprintf("%s: %v", ev.Outcome, ev.Err)
			if order == slowOrder {
				rep.SlowOrderDeliveries++
			}
			switch ev.Outcome {
			case idempotency.OutcomeProcessed:
				rep.Processed++
				what = fmt.Sprintf("charged (fencing token %d, attempt %d)", ev.Lease.Token, ev.Lease.Attempt)
			case idempotency.OutcomeDuplicate:
				rep.Duplicates++
				rep.SlowOrderCaught = rep.SlowOrderCaught || order == slowOrder
				what = "duplicate dropped"
				if ev.Waited > 0 {
					rep.DuplicatesAfterWait++
					what = fmt.Sprintf("waited %v for the copy in progress, then dropped the duplicate", ev.Waited.Round(10*time.Millisecond))
				}
			case idempotency.OutcomeHandlerFailed:
				rep.FailedAttempts++
				what = fmt.Sprintf("failed (%v): lease released; SQS redelivers after the visibility timeout", ev.Err)
			case idempotency.OutcomeInProgress:
				what = "held by a copy still running: nacked"
				var ipe *idempotency.InProgressError
				if errors.As(ev.Err, &ipe) {
					what = fmt.Sprintf("held by a copy still running: nacked; Defer makes it visible again when that lease runs out (%v)",
						ipe.Remaining.Round(100*time.Millisecond))
				}
			}
			if ev.Outcome.Acked() {
				acked.Add(1)
			}
			if order == slowOrder || order == flakyOrder || !ev.Outcome.Acked() {
				fmt.Fprintf(w, "  %-10s %-12s %s\n", consumer, order, what)
			}
		})
	}

	for _, consumer := range []string{"consumer-a", "consumer-b"} {
		sub, err := wsqs.NewSubscriber(wsqs.SubscriberConfig{
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
		if err != nil {
			return rep, err
		}
		idem, err := idempotency.New(idempotency.Config{
			Store:     store,
			Key:       keyfunc.JSONField("order_id"),
			Namespace: "charge",
			// About the queue's visibility timeout: a crashed consumer's key
			// is free again when SQS brings its message back.
			LeaseTTL: visibilityTimeout,
			// A copy whose key is held waits briefly, then is nacked and
			// deferred, instead of holding an SQS worker.
			InProgressWait: 200 * time.Millisecond,
			Observer:       observer(consumer),
		})
		if err != nil {
			return rep, err
		}
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
		if err != nil {
			return rep, err
		}
		router.AddMiddleware(track, deferrer.Middleware, idem.Middleware)
		router.AddConsumerHandler("charge-"+consumer, queue, sub, func(msg *message.Message) error {
			order := msg.Metadata.Get("order_id")
			if order == slowOrder {
				select {
				case <-time.After(slowFor):
				case <-msg.Context().Done():
					return msg.Context().Err()
				}
			}
			if order == flakyOrder && flakyFailed.CompareAndSwap(false, true) {
				return errors.New("payment gateway timeout")
			}
			mu.Lock()
			charges[order]++
			mu.Unlock()
			return nil
		})
		routers = append(routers, router)
		go func() { _ = router.Run(ctx) }()
		select {
		case <-router.Running():
		case <-ctx.Done():
			return rep, ctx.Err()
		}
	}

	pub, err := wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: awsCfg, OptFns: endpoint, DoNotCreateQueueIfNotExists: true}, logger)
	if err != nil {
		return rep, err
	}
	defer pub.Close()
	send := func(order string) error {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order_id":%q,"amount":"10.00"}`, order)))
		msg.Metadata.Set("order_id", order)
		rep.Published++
		return pub.Publish(queue, msg)
	}
	fmt.Fprintf(w, "Publishing %d orders, every regular order twice (a producer retry), to queue %s\n", rep.Orders, queue)
	fmt.Fprintf(w, "(visibility timeout %v; %s takes %v, and is retried at once; %s fails once)\n\n", visibilityTimeout, slowOrder, slowFor, flakyOrder)
	for _, order := range []string{slowOrder, slowOrder, flakyOrder} {
		if err := send(order); err != nil {
			return rep, err
		}
	}
	for i := range cfg.Orders {
		for range 2 {
			if err := send("order-" + strconv.Itoa(i)); err != nil {
				return rep, err
			}
		}
	}

	// Done when every order is charged, every message was acked at least
	// once, a deferred copy of the slow order came back and was dropped,
	// and nothing is in flight.
	for {
		mu.Lock()
		charged, caught := len(charges), rep.SlowOrderCaught
		mu.Unlock()
		if charged == rep.Orders && acked.Load() >= int64(rep.Published) && caught && deferred.Load() > 0 && inFlight.Load() == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return rep, fmt.Errorf("not every delivery was settled (%d of %d orders charged): %w", charged, rep.Orders, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}

	if err := closeAll(); err != nil {
		return rep, fmt.Errorf("closing the consumers: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	rep.ChargesPerOrder = charges
	rep.Deferred = deferred.Load()
	fmt.Fprintf(w, "\nSummary: %d messages for %d orders: %d charged, %d duplicate deliveries dropped (%d after waiting for the holder), %d failed attempt retried; the slow order's copies were delivered %d times, %d deferred by Defer.\n",
		rep.Published, rep.Orders, rep.Processed, rep.Duplicates, rep.DuplicatesAfterWait, rep.FailedAttempts, rep.SlowOrderDeliveries, rep.Deferred)
	verdict := rep.Check()
	if verdict != nil {
		fmt.Fprintf(w, "Check FAILED: %v\n", verdict)
	} else {
		fmt.Fprintf(w, "Check: %d orders charged once each, every message acked, the slow order's in-flight copies deferred and dropped.\n", len(charges))
	}
	return rep, verdict
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
		return store, func() { client.Close() }, err
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
	}
	return nil, nil, fmt.Errorf("STORE must be redis or postgres, got %q", cfg.Store)
}
