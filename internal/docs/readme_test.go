package docs

import (
	"context"
)

// snippet:quickstart
import (
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// end snippet

var _ = quickstart

func quickstart(router *message.Router, sub message.Subscriber, pub message.Publisher, redisClient redis.UniversalClient,
	charge func(ctx context.Context, msg *message.Message, fence int64) error) error {
	// snippet:quickstart
	store, err := redisstore.New(redisClient, redisstore.Options{}) // any go-redis v9 client
	if err != nil {
		return err
	}
	idem, err := idempotency.New(idempotency.Config{
		Store: store,                         // redisstore, pgstore, mysqlstore, dynamostore (many instances) or memstore (one process)
		Key:   keyfunc.JSONField("order_id"), // or keyfunc.UUID(), Metadata, PayloadHash, First, your own
	})
	if err != nil {
		return err // invalid config is an error, never a panic
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
	// end snippet
	return nil
}
