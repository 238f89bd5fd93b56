package docs

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// snippet:redis
import (
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// end snippet

var _ = redisSetup

// ctx is the context the router runs with.
func redisSetup(ctx context.Context, router *message.Router) error {
	// snippet:redis
	// The store's own client and pool: lease keeping never waits behind
	// other Redis traffic.
	client := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:                 []string{"localhost:6379"}, // or several: Cluster; MasterName: Sentinel
		ContextTimeoutEnabled: true,                       // see "Client settings"
	})
	store, err := redisstore.New(client, redisstore.Options{Prefix: "billing:idem:"})
	if err != nil {
		return err
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Key: keyfunc.JSONField("order_id")})
	if err != nil {
		return err
	}
	router.AddMiddleware(idem.Middleware)
	// When the router's context ends, end the store's subscriptions (they
	// wake waiting duplicates).
	context.AfterFunc(ctx, func() { _ = store.Close() })
	// end snippet
	return nil
}
