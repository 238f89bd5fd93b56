package sqloutbox_test

import (
	"context"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/httpidem"
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

// Work outside a Watermill handler: an HTTP handler refunds an order at
// most once, however often the client retries, through Do. The refund
// row, the event that announces it (in the outbox table) and the
// completion of the order's key commit together. Compiled, not run: it
// needs Postgres.
func ExamplePostgres_WithTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		panic(err)
	}
	store, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		panic(err)
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "refund"})
	if err != nil {
		panic(err)
	}
	outbox, err := sqloutbox.NewPostgres(pool, store, sqloutbox.Options{})
	if err != nil {
		panic(err)
	}
	http.HandleFunc("POST /orders/{id}/refund", func(w http.ResponseWriter, r *http.Request) {
		if err := refund(r.Context(), idem, outbox, r.PathValue("id")); err != nil {
			http.Error(w, "refund failed, try again", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// snippet:withtx
// refund refunds an order at most once to completion, whoever calls it:
// an HTTP handler, a job, a command.
func refund(ctx context.Context, idem *idempotency.Idempotency, outbox *sqloutbox.Postgres, orderID string) error {
	_, err := idempotency.Do(ctx, idem, orderID, func(ctx context.Context) (struct{}, error) {
		// ctx carries the lease Do holds on "refund:"+orderID: WithTx
		// completes that key in its transaction, and Do does not
		// complete it again. Pass this ctx, not the outer one.
		return struct{}{}, outbox.WithTx(ctx, func(tx *sqloutbox.PgxTx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO refunds (order_id) VALUES ($1)`, orderID); err != nil {
				return err
			}
			return tx.Publish("refunds", message.NewMessage("refund-"+orderID, []byte(orderID)))
		})
	})
	return err // on an error nothing was recorded: call again
}

// end snippet

// An HTTP endpoint behind httpidem whose order row, OrderPlaced message
// and key completion, with the 201 response, commit in one transaction.
// Compiled, not run: it needs Postgres.
func ExamplePostgres_WithTx_http() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		panic(err)
	}
	store, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		panic(err)
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "orders-api"})
	if err != nil {
		panic(err)
	}
	outbox, err := sqloutbox.NewPostgres(pool, store, sqloutbox.Options{})
	if err != nil {
		panic(err)
	}
	keys, err := httpidem.New(httpidem.Config{Idempotency: idem, Required: true})
	if err != nil {
		panic(err)
	}
	http.Handle("POST /orders", keys.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// snippet:http
		id := watermill.NewUUID()
		err := outbox.WithTx(r.Context(), func(tx *sqloutbox.PgxTx) error {
			if _, err := tx.Exec(r.Context(), `INSERT INTO orders (id) VALUES ($1)`, id); err != nil {
				return err
			}
			if err := tx.Publish("orders", message.NewMessage(id, []byte(id))); err != nil {
				return err
			}
			// Written before the commit: the key is completed with this
			// response, in this transaction, and a retry replays it.
			w.Header().Set("Location", "/orders/"+id)
			w.WriteHeader(http.StatusCreated)
			return nil
		})
		if err != nil {
			// Nothing was recorded. The 201 was kept, not sent (httpidem
			// sends the response when the handler returns): discard it. A
			// 5xx releases the key, so the retry runs again.
			httpidem.Reset(w)
			http.Error(w, "try again", http.StatusServiceUnavailable)
		}
		// end snippet
	})))
}

// Pruning forwarded outbox rows from a periodic job in the service.
// Compiled, not run: it needs Postgres.
func ExamplePostgres_Prune() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		panic(err)
	}
	store, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		panic(err)
	}
	outbox, err := sqloutbox.NewPostgres(pool, store, sqloutbox.Options{})
	if err != nil {
		panic(err)
	}
	logger := watermill.NewStdLogger(false, false)
	// snippet:prune
	go func() {
		for range time.Tick(5 * time.Minute) {
			// Forwarded rows older than a day, 1000 per statement; never a
			// row the Forwarder has not passed.
			n, err := outbox.Prune(ctx, 24*time.Hour, sqloutbox.DefaultPruneBatch)
			if err != nil {
				logger.Error("pruning the outbox", err, nil)
				continue
			}
			logger.Debug("pruned the outbox", watermill.LogFields{"rows": n})
		}
	}()
	// end snippet
}

// The Forwarder pruning what it forwarded, a day after.
// Compiled, not run: it needs Postgres.
func ExampleOptions_retention() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		panic(err)
	}
	store, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		panic(err)
	}
	// snippet:retention
	outbox, err := sqloutbox.NewPostgres(pool, store, sqloutbox.Options{
		Retention: 24 * time.Hour, // forwarded rows are kept a day, for inspection
	})
	// end snippet
	if err != nil {
		panic(err)
	}
	_ = outbox
}
