package main

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// countingStore counts Acquire calls.
type countingStore struct {
	backends.Store
	acquires atomic.Int64
}

func (c *countingStore) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	c.acquires.Add(1)
	return c.Store.Acquire(ctx, req)
}

// streamRouter runs a router that consumes stream on Redis Streams through
// idem, with the subscriber's default NackResendSleep (none: a nacked
// entry is resent at once), and returns a function that publishes a
// payload to the stream. Everything stops when the test ends.
func streamRouter(t *testing.T, client *redis.Client, stream string, idem *idempotency.Idempotency, h message.NoPublishHandlerFunc) func(payload string) {
	t.Helper()
	t.Cleanup(func() { client.Del(context.Background(), stream) })
	logger := watermill.NopLogger{}
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client: client, Consumer: "c", ConsumerGroup: stream + "-g", OldestId: "0", BlockTime: 50 * time.Millisecond,
	}, logger)
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	router.AddConsumerHandler("charge", stream, sub, h).AddMiddleware(idem.Middleware)
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close(); _ = router.Close() })
	return func(payload string) {
		if err := pub.Publish(stream, message.NewMessage(watermill.NewUUID(), []byte(payload))); err != nil {
			t.Fatal(err)
		}
	}
}

// storeOutage is a go-redis hook that, while on, fails every call at once with
// a refused connection, as a stopped Redis server would.
type storeOutage struct{ on atomic.Bool }

var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

func (o *storeOutage) DialHook(next redis.DialHook) redis.DialHook { return next }

func (o *storeOutage) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if o.on.Load() {
			cmd.SetErr(errRefused)
			return errRefused
		}
		return next(ctx, cmd)
	}
}

func (o *storeOutage) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if o.on.Load() {
			for _, cmd := range cmds {
				cmd.SetErr(errRefused)
			}
			return errRefused
		}
		return next(ctx, cmds)
	}
}

// acquiresWhileHeld delivers one message through Redis Streams (whose nack
// resends at once: NackResendSleep is left at its default, none) while
// another worker holds its key for hold, and returns how many Acquire
// calls the middleware made in that time.
func acquiresWhileHeld(t *testing.T, wait time.Duration, hold time.Duration) int64 {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: testenv.Service(t, "REDIS_ADDR"), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	prefix := testenv.Unique("hotloop-")
	inner, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	store := &countingStore{Store: inner}
	if _, err := inner.Acquire(ctx, backends.AcquireRequest{Key: "charge:o-1", Owner: "other", LeaseTTL: hold, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}

	idem, err := idempotency.New(idempotency.Config{
		Store: store, Namespace: "charge", Key: keyfunc.JSONField("order_id"),
		LeaseTTL: time.Minute, Timing: idempotency.Timing{InProgressWait: wait},
	})
	if err != nil {
		t.Fatal(err)
	}
	publish := streamRouter(t, client, prefix+"orders", idem, func(*message.Message) error { return nil })
	publish(`{"order_id":"o-1"}`)
	time.Sleep(hold)
	return store.acquires.Load()
}

// Redis Streams resends a nacked entry at once. An in-flight duplicate that
// did not wait would turn that into a hot loop against the store; with the
// default bounded wait, a two-second hold costs a handful of store calls.
func TestBoundedWaitPreventsHotLoopOnRedisStreams(t *testing.T) {
	const hold = 2 * time.Second
	withWait := acquiresWhileHeld(t, 0, hold)     // the default: wait for the holder
	withoutWait := acquiresWhileHeld(t, -1, hold) // nack at once
	t.Logf("store Acquire calls during a %v hold: %d with the default wait, %d without waiting", hold, withWait, withoutWait)
	if withWait > 20 {
		t.Errorf("%d store calls in %v with the bounded wait; its back-off allows about 10", withWait, hold)
	}
	if withoutWait < 10*withWait {
		t.Errorf("without the wait the nack loop made only %d store calls (with it: %d); the comparison shows nothing", withoutWait, withWait)
	}
}

// acquiresDuringOutage delivers messages through Redis Streams while the
// store's own Redis is down for outage, and returns how many Acquire calls
// the middleware made in that time. Every store-error nack is resent at
// once by Redis Streams. When the store is back, every message is
// processed.
func acquiresDuringOutage(t *testing.T, maxBackoff, outage time.Duration) int64 {
	const messages = 5
	// The worst case: a store whose every call fails at once (a refused
	// connection), without go-redis's own dial retries slowing it.
	storeClient := redis.NewClient(&redis.Options{Addr: testenv.Service(t, "REDIS_ADDR"), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = storeClient.Close() })
	down := &storeOutage{}
	storeClient.AddHook(down)
	prefix := testenv.Unique("outage-")
	inner, err := redisstore.New(storeClient, redisstore.Options{Prefix: prefix + "idem:"})
	if err != nil {
		t.Fatal(err)
	}
	store := &countingStore{Store: inner}

	client := redis.NewClient(&redis.Options{Addr: testenv.Service(t, "REDIS_ADDR")})
	t.Cleanup(func() { _ = client.Close() })
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "charge", Key: keyfunc.JSONField("order_id"), Timing: idempotency.Timing{StoreBackoff: idempotency.Backoff{Max: maxBackoff}}})
	if err != nil {
		t.Fatal(err)
	}
	down.on.Store(true)
	var processed atomic.Int32
	publish := streamRouter(t, client, prefix+"orders", idem,
		func(*message.Message) error { processed.Add(1); return nil })
	for i := range messages {
		publish(fmt.Sprintf(`{"order_id":"o-%d"}`, i))
	}
	time.Sleep(outage)
	calls := store.acquires.Load()
	down.on.Store(false)
	deadline := time.Now().Add(time.Minute)
	for processed.Load() < messages {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages processed a minute after the store came back", processed.Load(), messages)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return calls
}

// The store is down while Redis Streams, whose nack resends an entry at
// once, keeps delivering. With the default StoreBackoff.Max (2s), the
// store sees a trickle of calls: one probe at a time, spaced out up to 2s
// apart, and each failed delivery pauses before its nack. The control,
// with the backoff cut to 1ms, shows the storm it prevents.
func TestStoreOutageOnRedisStreams(t *testing.T) {
	const outage = 6 * time.Second
	guarded := acquiresDuringOutage(t, idempotency.DefaultStoreBackoffMax, outage)
	control := acquiresDuringOutage(t, time.Millisecond, outage)
	t.Logf("store Acquire calls during a %v store outage on Redis Streams: %d (%.1f/s) with the default StoreBackoff.Max, %d (%.1f/s) with 1ms",
		outage, guarded, float64(guarded)/outage.Seconds(), control, float64(control)/outage.Seconds())
	// The first calls (one delivery at a time here), then probes after 10,
	// 20, 40 ... 1280ms, then every 2s, each ±20%: about 11 in 6s, never
	// more than 1 + 8 + outage/1.6s, rounded up.
	if limit := int64(1 + 8 + outage/(1600*time.Millisecond) + 1); guarded > limit {
		t.Errorf("%d store calls during a %v outage; the backoff allows about %d", guarded, outage, limit)
	}
	if control < 10*guarded {
		t.Errorf("with a 1ms backoff only %d store calls (default: %d); the comparison shows nothing", control, guarded)
	}
}
