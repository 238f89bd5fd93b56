// Command redis is an order-processing service on Redis Streams with the
// idempotency middleware and its Redis lease store.
//
// Two consumer instances share a consumer group and the lease store. Each
// use of Redis has a client and a pool of its own, as in production: the
// stream, the leases (so lease keeping never waits behind other traffic)
// and the charges. A
// producer sends order events with the duplicates real producers make (the
// same order_id under new message UUIDs). One order's handler fails once;
// one is slow enough that Redis Streams claims its entry for the other
// consumer while the first still runs. Each charge is recorded in a Redis
// hash, the visible side effect: every order must be charged exactly once.
//
// Configuration (environment): REDIS_ADDR (default 127.0.0.1:6379).
//
//	go run ./redis
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := Config{RedisAddr: env("REDIS_ADDR", "127.0.0.1:6379"), Orders: 20}
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
	// Orders is how many distinct orders the producer sends.
	Orders int
	// Prefix keeps the run's stream, group and keys apart. Defaults to a
	// fresh one per run.
	Prefix string
}

// The orders with a story.
const (
	slowOrder   = "order-slow"  // Redis Streams claims it from a slow consumer
	flakyOrder  = "order-flaky" // the payment gateway fails the first attempt
	slowFor     = 2 * time.Second
	maxIdleTime = 500 * time.Millisecond
)

// Report is what happened.
type Report struct {
	Published, Orders   int
	ChargesPerOrder     map[string]int64
	Processed           int64
	Duplicates          int64
	DuplicatesAfterWait int64
	FailedAttempts      int64
	// SlowOrderDeliveries counts deliveries of the slow order's single
	// stream entry: more than one means Redis Streams claimed it.
	SlowOrderDeliveries int64
	// SlowOrderCaught is set when a claimed copy of the slow order was
	// dropped as a duplicate instead of charging again.
	SlowOrderCaught bool
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
	if r.Processed != int64(r.Orders) {
		errs = append(errs, fmt.Errorf("%d processed for %d orders", r.Processed, r.Orders))
	}
	if r.FailedAttempts != 1 {
		errs = append(errs, fmt.Errorf("%d failed attempts, want the flaky order's one", r.FailedAttempts))
	}
	if r.SlowOrderDeliveries < 2 || !r.SlowOrderCaught {
		errs = append(errs, fmt.Errorf("the slow order was delivered %d times and its claim was not caught", r.SlowOrderDeliveries))
	}
	return errors.Join(errs...)
}

// Run runs the story and prints what happened to w.
func Run(ctx context.Context, cfg Config, w io.Writer) (Report, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = fmt.Sprintf("example-%d:", time.Now().UnixNano())
	}
	logger := watermill.NopLogger{}
	newClient := func() *redis.Client {
		return redis.NewClient(&redis.Options{Addr: cfg.RedisAddr, ContextTimeoutEnabled: true})
	}
	// The broker's, the lease store's and the business writes' clients.
	client, storeClient, business := newClient(), newClient(), newClient()
	defer client.Close()
	defer storeClient.Close()
	defer business.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		return Report{}, fmt.Errorf("redis at %s: %w", cfg.RedisAddr, err)
	}
	topic, charges := cfg.Prefix+"orders", cfg.Prefix+"charges"
	defer client.Del(context.Background(), topic, charges)

	store, err := redisstore.New(storeClient, redisstore.Options{Prefix: cfg.Prefix + "idem:"})
	if err != nil {
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
		flakyFailed atomic.Bool
		inFlight    atomic.Int64
		slowSeenBy  = map[string]bool{}
	)
	// track counts deliveries inside the middleware chain, so the run can
	// tell when none is left waiting for a holder.
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
				slowSeenBy[consumer] = true
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

					what = fmt.Sprintf("waited %v for the consumer holding it, then dropped the duplicate", ev.Waited.Round(10*time.Millisecond))
				}
			case idempotency.OutcomeHandlerFailed:
				rep.FailedAttempts++
				what = fmt.Sprintf("failed (%v): lease released, nacked for redelivery", ev.Err)
			case idempotency.OutcomeInProgress:
				what = "still in progress elsewhere after the wait: nacked, will come back"
			}
			if order == slowOrder || order == flakyOrder || !ev.Outcome.Acked() {
				fmt.Fprintf(w, "  %-9s %-12s %s\n", consumer, order, what)
			}
		})
	}

	for _, consumer := range []string{"consumer-a", "consumer-b"} {
		sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client:        client,
			Consumer:      consumer,
			ConsumerGroup: cfg.Prefix + "billing",
			OldestId:      "0",
			// Claim entries idle this long from a consumer that seems stuck:
			// short here so the story is quick; the lease catches the claim.
			MaxIdleTime:     maxIdleTime,
			ClaimInterval:   100 * time.Millisecond,
			NackResendSleep: 100 * time.Millisecond,
			BlockTime:       100 * time.Millisecond,
		}, logger)
		if err != nil {
			return rep, err
		}
		idem, err := idempotency.New(idempotency.Config{
			Store:     store,
			Key:       keyfunc.JSONField("order_id"),
			Namespace: "charge",
			// Longer than the slowest charge would be pointless: the lease is
			// renewed every LeaseTTL/3 while the handler runs.
			LeaseTTL: 3 * time.Second,
			Observer: observer(consumer),
		})
		if err != nil {
			return rep, err
		}
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
		if err != nil {
			return rep, err
		}
		router.AddMiddleware(track, idem.Middleware)
		router.AddConsumerHandler("charge-"+consumer, topic, sub, func(msg *message.Message) error {
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
			return business.HIncrBy(msg.Context(), charges, order, 1).Err()
		})
		routers = append(routers, router)
		go func() { _ = router.Run(ctx) }()
		select {
		case <-router.Running():
		case <-ctx.Done():
			return rep, ctx.Err()
		}
	}

	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, logger)
	if err != nil {
		return rep, err
	}
	defer pub.Close()
	send := func(order string) error {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order_id":%q,"amount":"10.00"}`, order)))
		msg.Metadata.Set("order_id", order)
		rep.Published++
		return pub.Publish(topic, msg)
	}
	fmt.Fprintf(w, "Publishing %d orders, every regular order twice (a producer retry), to %s\n", rep.Orders, topic)
	fmt.Fprintf(w, "(%s takes %v; Redis Streams claims entries idle for %v)\n\n", slowOrder, slowFor, maxIdleTime)
	if err := send(slowOrder); err != nil {
		return rep, err
	}
	if err := send(flakyOrder); err != nil {
		return rep, err
	}
	for i := range cfg.Orders {
		for range 2 {
			if err := send(fmt.Sprintf("order-%03d", i)); err != nil {
				return rep, err
			}
		}
	}

	// Done when every order is charged, nothing is pending in the group or
	// in flight in a consumer, and both consumers have seen the slow order
	// (the claim).
	group := cfg.Prefix + "billing"
	for {
		charged, _ := client.HLen(ctx, charges).Result()
		pending, _ := client.XPending(ctx, topic, group).Result()
		mu.Lock()
		slow, both := rep.SlowOrderDeliveries, len(slowSeenBy) == 2
		mu.Unlock()
		if charged == int64(rep.Orders) && pending != nil && pending.Count == 0 && both && inFlight.Load() == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return rep, fmt.Errorf("not every delivery was settled (%d of %d orders charged, slow order seen %d times): %w",
				charged, rep.Orders, slow, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}

	if err := closeAll(); err != nil {
		return rep, fmt.Errorf("closing the consumers: %w", err)
	}
	counts, err := business.HGetAll(ctx, charges).Result()
	if err != nil {
		return rep, err
	}
	mu.Lock()
	defer mu.Unlock()
	rep.ChargesPerOrder = make(map[string]int64, len(counts))
	for order, n := range counts {
		var v int64
		fmt.Sscan(n, &v)
		rep.ChargesPerOrder[order] = v
	}
	fmt.Fprintf(w, "\nSummary: %d messages for %d orders: %d charged, %d duplicate deliveries dropped (%d after waiting for the holder), %d failed attempt retried; the slow order's entry was delivered %d times.\n",
		rep.Published, rep.Orders, rep.Processed, rep.Duplicates, rep.DuplicatesAfterWait, rep.FailedAttempts, rep.SlowOrderDeliveries)
	verdict := rep.Check()
	if verdict != nil {
		fmt.Fprintf(w, "Check FAILED: %v\n", verdict)
	} else {
		fmt.Fprintf(w, "Check: %d orders charged once each (counted in Redis), the claimed slow order caught by its lease.\n", len(counts))
	}
	return rep, verdict
}
