package pgstore_test

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// A handler that writes its own row and completes the key in the same
// transaction: exactly-once effects, even if the process dies before the
// ack.
func ExampleStore_CompleteTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		panic(err)
	}
	store, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Key: keyfunc.JSONField("order_id")})
	if err != nil {
		panic(err)
	}

	charge := func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		lease, _ := idempotency.LeaseFromContext(ctx)
		out := []*message.Message{message.NewMessage("receipt-"+msg.UUID, msg.Payload)}

		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
		if _, err := tx.Exec(ctx, `INSERT INTO charges (payload, fence) VALUES ($1, $2)`, msg.Payload, lease.Token); err != nil {
			return nil, err
		}
		// Complete the key in the same transaction, with the output to
		// replay if publishing it fails.
		if err := store.CompleteTx(ctx, tx, lease, out); err != nil {
			return nil, err
		}
		return out, tx.Commit(ctx)
	}
	_ = idem.Middleware(charge) // router.AddHandler(..., idem.Middleware(charge)) or AddMiddleware
}
