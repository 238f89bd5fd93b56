package docs

import (
	"math"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/keyfunc"
)

// snippet:migrating
import (
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// end snippet

var _, _ = migrating, sharedRepository

func migrating(router *message.Router, repo middleware.ExpiringKeyRepository, store backends.Store) error {
	// snippet:migrating
	// Before
	dedup := &middleware.Deduplicator{
		KeyFactory: middleware.NewMessageHasherSHA256(math.MaxInt64),
		Repository: repo,
		Timeout:    time.Minute,
	}
	router.AddMiddleware(dedup.Middleware)

	// After
	idem, err := idempotency.New(idempotency.Config{
		Store:     store,                 // memstore, redisstore or pgstore
		Key:       keyfunc.PayloadHash(), // the equivalent of NewMessageHasherSHA256
		Retention: time.Minute,           // the Deduplicator's window; usually you want longer
	})
	if err != nil {
		return err
	}
	router.AddMiddleware(idem.Middleware)
	// end snippet
	return nil
}

func sharedRepository(router *message.Router, store backends.Store) error {
	// snippet:repository
	// A first step: the Deduplicator as it is, sharing what it saw through
	// the store (redisstore, pgstore, mysqlstore, dynamostore) instead of
	// one process's memory. Its flaws stay (see above).
	repo, err := idempotency.NewKeyRepository(store, time.Minute) // the window
	if err != nil {
		return err
	}
	dedup := &middleware.Deduplicator{
		KeyFactory: middleware.NewMessageHasherSHA256(math.MaxInt64),
		Repository: repo,
		Timeout:    time.Minute,
	}
	router.AddMiddleware(dedup.Middleware)
	// end snippet
	return nil
}
