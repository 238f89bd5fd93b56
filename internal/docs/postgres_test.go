package docs

import (
	"context"
	"encoding/json"
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
	// The store's own small pool, apart from the one your handlers use:
	// lease keeping never waits behind business queries.
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	cfg.MaxConns = 4
	storePool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	store, err := pgstore.New(storePool, pgstore.Options{})
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

func completeTx(db *pgxpool.Pool, store *pgstore.Store) message.HandlerFunc {
	// snippet:complete-tx
	// db is your application's pool (not the store's), with the table
	//
	//	CREATE TABLE charges (order_id text PRIMARY KEY, amount_cents bigint NOT NULL);
	charge := func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		lease, _ := idempotency.LeaseFromContext(ctx)
		var order struct {
			OrderID     string `json:"order_id"` // the key: keyfunc.JSONField("order_id")
			AmountCents int64  `json:"amount_cents"`
		}
		if err := json.Unmarshal(msg.Payload, &order); err != nil {
			return nil, err
		}
		// The messages this handler publishes (nil if none): stored with
		// the completion and replayed to every duplicate.
		out := []*message.Message{message.NewMessage("receipt-"+order.OrderID, msg.Payload)}

		tx, err := db.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // after Commit it does nothing
		if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, amount_cents) VALUES ($1, $2)`,
			order.OrderID, order.AmountCents); err != nil {
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
