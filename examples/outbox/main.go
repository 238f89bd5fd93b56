// Command outbox is an order service that charges every order once and
// publishes its receipt once, through a transactional outbox: the charge
// row, the receipt and the completion of the order's idempotency key are
// written in one Postgres transaction, and a Forwarder moves the receipt
// to the broker afterwards. A redelivered order whose key is completed is
// acked without running the handler and publishes nothing.
//
// main.go is the service, top to bottom: the broker (Redis Streams), the
// database pool, the lease store, the outbox, the middleware, the router
// and its handler, the Forwarder, graceful shutdown. demo.go is the
// demonstration, apart from the service: a producer that sends every
// order twice, a downstream consumer of the receipts, and the check of
// what happened. Run with -serve, the service runs alone until SIGINT or
// SIGTERM.
//
// Configuration (environment):
//
//	DATABASE_URL  the Postgres of the leases, the charges and the outbox
//	              (default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)
//	REDIS_ADDR    the Redis of the orders' and the receipts' streams (default 127.0.0.1:6379)
//	PREFIX        prepended to every stream, group and table name (default demo_<unix nanoseconds>_,
//	              fresh for each run; give copies of the service the same one)
//
// Usage:
//
//	go run ./outbox          # the demo: exits non-zero if one of its claims is false
//	go run ./outbox -serve   # the service alone
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

const (
	// maxIdleTime: Redis Streams hands an entry pending this long to
	// another consumer; leaseTTL is about it (docs/brokers.md).
	maxIdleTime = time.Second
	leaseTTL    = 3 * maxIdleTime
)

type config struct {
	databaseURL string
	redisAddr   string
	prefix      string
}

// names are the streams and tables of one deployment.
type names struct {
	orders, receipts, group string // streams and the consumer group
	charges, keys, outbox   string // tables; the outbox's is watermill_<outbox>
}

func namesFor(prefix string) names {
	return names{
		orders: prefix + "orders", receipts: prefix + "receipts", group: prefix + "billing",
		charges: prefix + "charges", keys: prefix + "keys", outbox: prefix + "outbox",
	}
}

func main() {
	serveOnly := flag.Bool("serve", false, "run the service alone, until SIGINT or SIGTERM: no demo orders, no check")
	flag.Parse()
	cfg := config{
		databaseURL: env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		redisAddr:   env("REDIS_ADDR", "127.0.0.1:6379"),
		prefix:      env("PREFIX", fmt.Sprintf("demo_%d_", time.Now().UnixNano())),
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, cfg, !*serveOnly)
	stop()
	if err != nil {
		fmt.Println("outbox example:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// order is what the orders stream carries.
type order struct {
	ID          string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// receipt is what the receipts stream carries.
type receipt struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// run runs the service until ctx ends, or withDemo until the demo's
// messages are settled, then shuts it down gracefully.
func run(ctx context.Context, cfg config, withDemo bool) error {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{ReplaceAttr: withoutTime}))
	wmLogger := shutdownIsNoError{watermill.NewSlogLoggerWithLevelMapping(logger, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})}
	n := namesFor(cfg.prefix)

	// The database: leases, charges and the outbox, in one Postgres.
	pool, err := pgxpool.New(ctx, cfg.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres at %s: %w", cfg.databaseURL, err)
	}
	store, err := pgstore.New(pool, pgstore.Options{Table: n.keys})
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	// The outbox table (watermill_<topic>) and the Forwarder's offsets.
	outbox, err := sqloutbox.NewPostgres(pool, store, sqloutbox.Options{Topic: n.outbox})
	if err != nil {
		return err
	}
	if err := outbox.Migrate(ctx); err != nil {
		return err
	}
	// The business table. No unique constraint: the transaction, not the
	// table, keeps an order from being charged twice.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+n.charges+` (
		order_id text NOT NULL, amount_cents bigint NOT NULL, fencing_token bigint NOT NULL,
		charged_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}

	// The broker: Redis Streams, for the orders and the receipts.
	// A client for the publisher, one for the subscriber (it closes it).
	newClient := func() *redis.Client {
		return redis.NewClient(&redis.Options{Addr: cfg.redisAddr, ContextTimeoutEnabled: true})
	}
	rdb := newClient()
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", cfg.redisAddr, err)
	}
	host, _ := os.Hostname()
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:                        newClient(),
		Consumer:                      fmt.Sprintf("%s-%d", host, os.Getpid()),
		ConsumerGroup:                 n.group,
		MaxIdleTime:                   maxIdleTime,
		ClaimInterval:                 maxIdleTime / 10,
		NackResendSleep:               100 * time.Millisecond,
		DisableIndefiniteInitialBlock: true,
	}, wmLogger)
	if err != nil {
		return err
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: rdb}, wmLogger)
	if err != nil {
		return err
	}

	// The idempotency middleware: one lease per order id, in Postgres.
	idem, err := idempotency.New(idempotency.Config{
		Store:     store,
		Key:       keyfunc.JSONField("order_id"),
		Namespace: "charge",
		LeaseTTL:  leaseTTL,
		Logger:    wmLogger,
	})
	if err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, wmLogger)
	if err != nil {
		return err
	}
	// The handler: the charge row and the receipt, in the transaction the
	// outbox begins; the outbox completes the order's key in it and
	// commits. It returns no messages: the router publishes nothing.
	charge := router.AddConsumerHandler("charge", n.orders, sub, outbox.Handler(
		func(tx *sqloutbox.PgxTx, msg *message.Message) error {
			var o order
			if err := json.Unmarshal(msg.Payload, &o); err != nil {
				return err
			}
			lease, _ := idempotency.LeaseFromContext(msg.Context())
			logger.Info("charging", "order", o.ID, "amount_cents", o.AmountCents, "fencing_token", lease.Token)
			if _, err := tx.Exec(msg.Context(), `INSERT INTO `+n.charges+` (order_id, amount_cents, fencing_token) VALUES ($1, $2, $3)`,
				o.ID, o.AmountCents, lease.Token); err != nil {
				return err
			}
			payload, err := json.Marshal(receipt{OrderID: o.ID, AmountCents: o.AmountCents})
			if err != nil {
				return err
			}
			// The receipt's UUID is the order's: a rerun of the handler
			// after a rollback writes the same message.
			return tx.Publish(n.receipts, message.NewMessage("receipt-"+o.ID, payload))
		}))
	charge.AddMiddleware(idem.Middleware)

	// The Forwarder, on a router of its own: the outbox table to the
	// receipts stream, each receipt at least once, under its own UUID.
	fwd, err := outbox.NewForwarder(pub, wmLogger, forwarder.Config{})
	if err != nil {
		return err
	}

	runCtx := ctx
	var d *demo
	if withDemo {
		if d, runCtx, err = startDemo(ctx, cfg, router.Running(), logger); err != nil {
			return err
		}
	}
	fwdDone := make(chan error, 1)
	go func() { fwdDone <- fwd.Run(runCtx) }()
	go func() {
		select {
		case <-router.Running():
			logger.Info("consuming", "stream", n.orders, "group", n.group, "outbox", "watermill_"+n.outbox)
		case <-runCtx.Done():
		}
	}()
	err = router.Run(runCtx)
	err = errors.Join(err, fwd.Close(), <-fwdDone)
	if err != nil {
		return err
	}
	logger.Info("shut down: no handler running")
	if d != nil {
		_ = rdb.Close()
		return d.verdict(ctx, pool)
	}
	return nil
}

// withoutTime drops the time from log lines: they are read in order.
func withoutTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

// shutdownIsNoError logs at debug the errors that only say a call was
// cancelled: the shutdown cancels the subscriber's read in progress, and
// watermill-redisstream logs it as an error, up to half a second later,
// after the router has returned.
type shutdownIsNoError struct{ watermill.LoggerAdapter }

func (l shutdownIsNoError) Error(msg string, err error, fields watermill.LogFields) {
	if errors.Is(err, context.Canceled) {
		l.LoggerAdapter.Debug(msg+": "+err.Error(), fields)
		return
	}
	l.LoggerAdapter.Error(msg, err, fields)
}

func (l shutdownIsNoError) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return shutdownIsNoError{l.LoggerAdapter.With(fields)}
}
