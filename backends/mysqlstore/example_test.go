package mysqlstore_test

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// snippet:completetx
import (
	"database/sql"

	_ "github.com/go-sql-driver/mysql"

	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// end snippet

// A handler that writes its own row and completes the key in the same
// transaction: exactly-once effects, even if the process dies before the
// ack.
func ExampleStore_CompleteTx() {
	if err := setup(context.Background()); err != nil {
		panic(err)
	}
}

func setup(ctx context.Context) error {
	// snippet:completetx
	db, err := sql.Open("mysql", "app:secret@tcp(localhost:3306)/app")
	if err != nil {
		return err
	}
	store, err := mysqlstore.New(db, mysqlstore.Options{})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Key: keyfunc.JSONField("order_id")})
	if err != nil {
		return err
	}

	charge := func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		lease, _ := idempotency.LeaseFromContext(ctx)
		out := []*message.Message{message.NewMessage("receipt-"+msg.UUID, msg.Payload)}

		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
		if _, err := tx.ExecContext(ctx, "INSERT INTO charges (payload, fence) VALUES (?, ?)", msg.Payload, lease.Token); err != nil {
			return nil, err
		}
		// Complete the key in the same transaction, with the output to
		// replay if publishing it fails.
		if err := store.CompleteTx(ctx, tx, lease, out); err != nil {
			return nil, err
		}
		return out, tx.Commit()
	}
	_ = idem.Middleware(charge) // router.AddHandler(..., idem.Middleware(charge)) or AddMiddleware
	// end snippet
	return nil
}
