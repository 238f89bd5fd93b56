package snippets

import (
	"context"
)

// snippet:quickstart
import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// end snippet

var _ = quickstart

func quickstart(ctx context.Context, redisAddr string, logger watermill.LoggerAdapter,
	charge func(ctx context.Context, msg *message.Message, fence int64) error) error {
	// snippet:quickstart
	// A Redis client for each user: closing a subscriber closes its client.
	newClient := func() *redis.Client { return redis.NewClient(&redis.Options{Addr: redisAddr}) }
	storeClient, pubClient := newClient(), newClient()
	defer storeClient.Close()
	defer pubClient.Close()

	store, err := redisstore.New(storeClient, redisstore.Options{}) // any go-redis v9 client
	if err != nil {
		return err
	}
	idem, err := idempotency.New(idempotency.Config{
		Store:    store,                         // redisstore, pgstore, mysqlstore, dynamostore (many instances) or memstore (one process)
		Key:      keyfunc.JSONField("order_id"), // or keyfunc.UUID(), Metadata, PayloadHash, First, your own
		LeaseTTL: 60 * time.Second,              // about the broker's redelivery delay: MaxIdleTime here (docs/brokers.md)
	})
	if err != nil {
		return err // invalid config is an error, never a panic
	}

	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: pubClient}, logger)
	if err != nil {
		return err
	}
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:        newClient(), // its own: Close closes it
		ConsumerGroup: "billing",   // every replica of the service in one group
		MaxIdleTime:   60 * time.Second,
	}, logger)
	if err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	// Messages that can never succeed (no key, another payload under a
	// known key) go to a poison topic; a duplicate whose key is in progress
	// never does.
	poison, err := middleware.PoisonQueueWithFilter(pub, "orders.poison", idempotency.IsPoison)
	if err != nil {
		return err
	}
	router.AddMiddleware(poison, idem.Middleware) // the poison queue outside

	router.AddConsumerHandler("charge-order", "orders", sub, func(msg *message.Message) error {
		lease, _ := idempotency.LeaseFromContext(msg.Context()) // lease.Token fences your writes
		return charge(msg.Context(), msg, lease.Token)
	})
	return router.Run(ctx) // until ctx ends; then it closes the subscriber, and its client
	// end snippet
}
