package docs

import (
	"context"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"
)

// snippet:postgres
import (
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// end snippet

var _, _ = postgresSetup, completeTx

// ctx is the context the router runs with.
func postgresSetup(ctx context.Context, router *message.Router) error {
	// snippet:postgres
	// The store's own pool: lease keeping never waits behind business queries.
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	store, err := pgstore.New(pool, pgstore.Options{}) // a *pgxpool.Pool, *pgx.Conn or pgx.Tx
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil { // once at start-up; idempotent
		return err
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Key: keyfunc.JSONField("order_id")})
	if err != nil {
		return err
	}
	router.AddMiddleware(idem.Middleware)
	// When the router's context ends, end the store's listening connection
	// (it wakes waiting duplicates).
	context.AfterFunc(ctx, func() { _ = store.Close() })
	// end snippet
	return nil
}

func completeTx(pool *pgxpool.Pool, store *pgstore.Store) message.HandlerFunc {
	// snippet:complete-tx
	charge := func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		lease, _ := idempotency.LeaseFromContext(ctx)
		out := []*message.Message{message.NewMessage("receipt-"+msg.UUID, msg.Payload)}

		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // after Commit it does nothing
		if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, amount) VALUES ($1, $2)`,
			msg.Metadata.Get("order_id"), msg.Metadata.Get("amount")); err != nil {
			return nil, err
		}
		// The completion, with the messages to replay to duplicates,
		// commits with the charge, or not at all.
		if err := store.CompleteTx(ctx, tx, lease, out); err != nil {
			return nil, err // the lease was lost: someone else holds the key now
		}
		return out, tx.Commit(ctx)
	}
	// end snippet
	return charge
}
