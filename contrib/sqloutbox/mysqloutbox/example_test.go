package mysqloutbox_test

import (
	"context"
	"database/sql"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/mysqloutbox"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// A handler that charges an order and publishes its receipt exactly once,
// on MySQL or MariaDB: the charge row, the receipt (in the outbox table)
// and the completion of the order's key commit together; a Forwarder
// moves the receipt to the broker. Compiled, not run: it needs MySQL and
// a broker.
func Example() {
	ctx := context.Background()
	var (
		sub    message.Subscriber // the orders' broker
		pub    message.Publisher  // where the receipts go
		logger = watermill.NewStdLogger(false, false)
	)
	db, err := sql.Open("mysql", "app:secret@tcp(localhost:3306)/app?parseTime=true")
	if err != nil {
		panic(err)
	}
	store, err := mysqlstore.New(db, mysqlstore.Options{})
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

	outbox, err := mysqloutbox.New(db, store, mysqloutbox.Options{})
	if err != nil {
		panic(err)
	}
	if err := outbox.Migrate(ctx); err != nil { // the outbox table and the Forwarder's offsets
		panic(err)
	}
	charge := router.AddConsumerHandler("charge", "orders", sub, outbox.Handler(
		func(tx *mysqloutbox.Tx, msg *message.Message) error {
			if _, err := tx.ExecContext(msg.Context(), `INSERT INTO charges (payload) VALUES (?)`, msg.Payload); err != nil {
				return err
			}
			return tx.Publish("receipts", message.NewMessage("receipt-"+msg.UUID, msg.Payload))
		}))
	charge.AddMiddleware(idem.Middleware)
	fwd, err := outbox.NewForwarder(pub, logger, forwarder.Config{})
	if err != nil {
		panic(err)
	}
	go func() { _ = fwd.Run(ctx) }()
	if err := router.Run(ctx); err != nil {
		panic(err)
	}
}

// Work outside a Watermill handler, on MySQL or MariaDB: a function run
// by Do refunds an order at most once, however often it is called. The
// refund row, the event that announces it (in the outbox table) and the
// completion of the order's key commit together. Compiled, not run: it
// needs MySQL.
func ExampleOutbox_WithTx() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@tcp(localhost:3306)/app?parseTime=true")
	if err != nil {
		panic(err)
	}
	store, err := mysqlstore.New(db, mysqlstore.Options{})
	if err != nil {
		panic(err)
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "refund"})
	if err != nil {
		panic(err)
	}
	outbox, err := mysqloutbox.New(db, store, mysqloutbox.Options{})
	if err != nil {
		panic(err)
	}
	orderID := "o-1"
	_, err = idempotency.Do(ctx, idem, orderID, func(ctx context.Context) (struct{}, error) {
		// ctx carries Do's lease: WithTx completes the key in its
		// transaction, and Do does not complete it again.
		return struct{}{}, outbox.WithTx(ctx, func(tx *mysqloutbox.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO refunds (order_id) VALUES (?)`, orderID); err != nil {
				return err
			}
			return tx.Publish("refunds", message.NewMessage("refund-"+orderID, []byte(orderID)))
		})
	})
	if err != nil {
		panic(err) // nothing was recorded, and the key was released: call again
	}
}
