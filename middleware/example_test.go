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

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// A router whose handler charges each order once, however often the order
// is delivered.
func Example() {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	defer pubSub.Close()

	store, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	counters := &idempotency.Counters{}
	idem, err := idempotency.New(idempotency.Config{
		Store:    store,
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
	fmt.Println("processed:", counters.Count(idempotency.OutcomeProcessed), "duplicates:", counters.Count(idempotency.OutcomeDuplicate))
	// Output:
	// charged: 1
	// processed: 1 duplicates: 2
}

// The fencing token is in the handler's context. Pass it to the systems the
// handler writes to, and have them keep one effect per idempotency key with
// the token that wrote it: a write with a lower token comes from a holder
// that was overtaken, and is refused (docs/concepts.md, "Fencing", shows
// the same in SQL).
func ExampleLeaseFromContext() {
	effects := map[string]int64{} // idempotency key -> token of the effect, as a table would keep it
	write := func(lease backends.Lease) error {
		if effects[lease.Key] > lease.Token {
			return errors.New("stale fencing token: a newer holder has written")
		}
		effects[lease.Key] = lease.Token
		return nil
	}

	store, _ := memstore.New(memstore.Options{})
	idem, _ := idempotency.New(idempotency.Config{Store: store, Namespace: "payments"})
	handler := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		lease, _ := idempotency.LeaseFromContext(msg.Context())
		fmt.Println(lease.Key, "token", lease.Token, "attempt", lease.Attempt)
		return nil, write(lease)
	})
	_, _ = handler(message.NewMessage("order-1", nil))
	_, _ = handler(message.NewMessage("order-2", nil)) // another key: its tokens start at 1 again
	fmt.Println(effects)

	// A holder of order-1 with token 1 that paused while another took the
	// key over (token 2) and wrote, is refused when it wakes up.
	effects["payments:order-1"] = 2
	fmt.Println(write(backends.Lease{Key: "payments:order-1", Token: 1}))
	// Output:
	// payments:order-1 token 1 attempt 1
	// payments:order-2 token 1 attempt 1
	// map[payments:order-1:1 payments:order-2:1]
	// stale fencing token: a newer holder has written
}

// Invalid configuration is an error from New, never a panic.
func ExampleNew_invalidConfig() {
	_, err := idempotency.New(idempotency.Config{LeaseTTL: time.Millisecond})
	fmt.Println(errors.Is(err, idempotency.ErrInvalidConfig))
	fmt.Println(err)
	// Output:
	// true
	// idempotency: invalid config: Store is required
	// LeaseTTL must be at least 10ms, got 1ms
}

// IsPoison is the filter for Watermill's PoisonQueueWithFilter: true for
// errors no redelivery can fix, false for those that must come back.
func ExampleIsPoison() {
	store, _ := memstore.New(memstore.Options{})
	idem, _ := idempotency.New(idempotency.Config{
		Store:     store,
		Key:       keyfunc.Metadata("Idempotency-Key"),
		Namespace: "payments",
		Timing:    idempotency.Timing{InProgressWait: -1}, // do not wait for the holder, to show the error at once
	})
	run := func(msg *message.Message, h message.HandlerFunc) error {
		_, err := idem.Middleware(h)(msg)
		return err
	}
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }

	noKey := run(message.NewMessage("m-1", nil), ok)
	fmt.Println("no key:", idempotency.IsPoison(noKey))

	keyed := message.NewMessage("m-2", nil)
	keyed.Metadata.Set("Idempotency-Key", "order-1")
	duplicate := keyed.Copy()
	_ = run(keyed, func(*message.Message) ([]*message.Message, error) {
		inFlight := run(duplicate, ok) // arrives while the first still holds the key
		fmt.Println("in-flight duplicate:", idempotency.IsPoison(inFlight), errors.Is(inFlight, idempotency.ErrInProgress))
		return nil, nil
	})
	// Output:
	// no key: true
	// in-flight duplicate: false true
}

// A message without a key is rejected with a *KeyError, which matches
// ErrInvalidKey and the extractor's own error, and which IsPoison routes
// to a poison queue.
func ExampleKeyError() {
	store, _ := memstore.New(memstore.Options{})
	idem, _ := idempotency.New(idempotency.Config{
		Store:     store,
		Key:       keyfunc.Metadata("Idempotency-Key"),
		Namespace: "payments",
	})
	_, err := idem.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-1", nil))
	var keyErr *idempotency.KeyError
	fmt.Println(errors.As(err, &keyErr), errors.Is(err, idempotency.ErrInvalidKey), errors.Is(err, keyfunc.ErrNoKey), idempotency.IsPoison(err))
	fmt.Println(err)
	// Output:
	// true true true true
	// idempotency: no usable key for message m-1: keyfunc: no key: metadata "Idempotency-Key" is missing or empty
}

// Any function, run at most once to completion per key: a job that a cron
// fires twice, a call to a payment provider retried after a timeout. The
// second call returns the first one's stored result.
func ExampleDo() {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	idem, err := idempotency.New(idempotency.Config{
		Store:     store,
		Namespace: "payments", // required for Do: the key space
	})
	if err != nil {
		panic(err)
	}
	type Receipt struct {
		ID     string
		Amount int
	}
	charges := 0
	charge := func(ctx context.Context) (Receipt, error) {
		lease, _ := idempotency.LeaseFromContext(ctx) // pass lease.Token to the payment system
		charges++
		return Receipt{ID: fmt.Sprintf("rcpt-%d", lease.Token), Amount: 1200}, nil
	}
	for range 2 {
		r, err := idempotency.Do(context.Background(), idem, "order-42", charge)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s %d\n", r.ID, r.Amount)
	}
	fmt.Println("charges:", charges)
	// Output:
	// rcpt-1 1200
	// rcpt-1 1200
	// charges: 1
}
