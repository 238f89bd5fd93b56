package sqloutbox_test

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// snippet:use
import (
	"github.com/ThreeDotsLabs/watermill/components/forwarder"

	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
)

// end snippet

// A handler that charges an order and publishes its receipt exactly once:
// the charge row, the receipt (in the outbox table) and the completion of
// the order's key commit together; a Forwarder moves the receipt to the
// broker. Compiled, not run: it needs Postgres and a broker.
func Example() {
	ctx := context.Background()
	var (
		sub    message.Subscriber // the orders' broker
		pub    message.Publisher  // where the receipts go
		logger = watermill.NewStdLogger(false, false)
	)
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		panic(err)
	}
	store, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		panic(err)
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Key: keyfunc.JSONField("order_id")})
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	if err := run(ctx, router, pool, store, idem, sub, pub, logger); err != nil {
		panic(err)
	}
}

func run(ctx context.Context, router *message.Router, pool *pgxpool.Pool, store *pgstore.Store,
	idem *idempotency.Idempotency, sub message.Subscriber, pub message.Publisher, logger watermill.LoggerAdapter) error {
	// snippet:use
	outbox, err := sqloutbox.NewPostgres(pool, store, sqloutbox.Options{})
	if err != nil {
		return err
	}
	if err := outbox.Migrate(ctx); err != nil { // the outbox table and the Forwarder's offsets
		return err
	}
	charge := router.AddConsumerHandler("charge", "orders", sub, outbox.Handler(
		func(tx *sqloutbox.PgxTx, msg *message.Message) error {
			// Business rows, through the transaction.
			if _, err := tx.Exec(msg.Context(), `INSERT INTO charges (payload) VALUES ($1)`, msg.Payload); err != nil {
				return err
			}
			// Output, into the outbox table in the same transaction. The
			// handler returns no messages: the router publishes nothing.
			return tx.Publish("receipts", message.NewMessage("receipt-"+msg.UUID, msg.Payload))
		}))
	charge.AddMiddleware(idem.Middleware) // the outbox completes the key in the transaction

	// The Forwarder, on a router of its own: outbox table → broker.
	fwd, err := outbox.NewForwarder(pub, logger, forwarder.Config{})
	if err != nil {
		return err
	}
	go func() { _ = fwd.Run(ctx) }()
	// end snippet
	return router.Run(ctx)
}
