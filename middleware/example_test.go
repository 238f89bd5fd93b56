package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// A router whose handler charges each order once, however often the order
// is delivered.
func Example() {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	defer pubSub.Close()

	counters := &middleware.Counters{}
	idem, err := middleware.New(middleware.Config{
		Store:    memstore.New(memstore.Options{}),
		Key:      keyfunc.JSONField("order_id"),
		Observer: counters,
	})
	if err != nil {
		panic(err)
	}

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(idem.Middleware)
	var charged atomic.Int32
	router.AddConsumerHandler("charge", "orders", pubSub, func(msg *message.Message) error {
		charged.Add(1)
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	defer router.Close()

	// The producer retried: the same order under three message UUIDs.
	for range 3 {
		_ = pubSub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"o-1"}`)))
	}
	fmt.Println("charged:", charged.Load())
	fmt.Println("processed:", counters.Count(middleware.OutcomeProcessed), "duplicates:", counters.Count(middleware.OutcomeDuplicate))
	// Output:
	// charged: 1
	// processed: 1 duplicates: 2
}

// The fencing token is in the handler's context; pass it to the systems the
// handler writes to, so they can refuse a stale holder's write.
func ExampleLeaseFromContext() {
	idem, _ := middleware.New(middleware.Config{Store: memstore.New(memstore.Options{}), Namespace: "payments"})
	handler := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		lease, _ := middleware.LeaseFromContext(msg.Context())
		fmt.Println(lease.Key, "token", lease.Token, "attempt", lease.Attempt)
		// e.g. UPDATE accounts SET ..., fence = $token WHERE id = $id AND fence < $token
		return nil, nil
	})
	_, _ = handler(message.NewMessage("m-1", nil))
	// Output: payments:m-1 token 1 attempt 1
}

// Invalid configuration is an error from New, never a panic.
func ExampleNew_invalidConfig() {
	_, err := middleware.New(middleware.Config{LeaseTTL: time.Millisecond})
	fmt.Println(errors.Is(err, middleware.ErrInvalidConfig))
	fmt.Println(err)
	// Output:
	// true
	// idempotency: invalid config: Store is required
	// LeaseTTL must be at least 10ms, got 1ms
}

// A message without a key is rejected with a typed error, which Watermill's
// PoisonQueueWithFilter can route with IsKeyError.
func ExampleIsKeyError() {
	idem, _ := middleware.New(middleware.Config{
		Store:     memstore.New(memstore.Options{}),
		Key:       keyfunc.Metadata("Idempotency-Key"),
		Namespace: "payments",
	})
	_, err := idem.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-1", nil))
	fmt.Println(middleware.IsKeyError(err), errors.Is(err, keyfunc.ErrNoKey))
	fmt.Println(err)
	// Output:
	// true true
	// idempotency: no usable key for message m-1: keyfunc: no key: metadata "Idempotency-Key" is missing or empty
}
