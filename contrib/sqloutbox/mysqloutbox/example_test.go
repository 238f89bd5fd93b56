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
