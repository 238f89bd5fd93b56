// Command http is an order API whose POST /orders creates each order once,
// however often a client retries it: the request carries an
// Idempotency-Key header, package httpidem holds a lease on it while the
// handler runs and replays the stored response to every retry, and the
// handler writes the order row, its OrderPlaced message (through a
// transactional outbox) and the key's completion with the 201 response in
// one Postgres transaction. A Forwarder moves OrderPlaced to Redis
// Streams, where a consumer charges each order once, keyed by the same
// idempotency key: the client's key carries from its retry to the charge,
// which commits with the completion of that key in one transaction too.
// GET /orders/{id} reads an order back.
//
// main.go is the service, top to bottom: the database, the lease store,
// the outbox, the HTTP middleware and handlers, the consumer, the
// Forwarder, graceful shutdown. demo.go is the demonstration, apart from
// the service: it runs the service as a child process, retries requests,
// sends concurrent copies, reuses a key for another order, kills the
// service in the middle of a request and starts it again, and checks what
// happened. Run with -serve, the service runs alone until SIGINT or
// SIGTERM.
//
// Configuration (environment):
//
//	HTTP_ADDR     where the API listens (default 127.0.0.1:8080)
//	DATABASE_URL  the Postgres of the leases, the orders, the charges and the outbox
//	              (default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)
//	REDIS_ADDR    the Redis of the OrderPlaced stream (default 127.0.0.1:6379)
//	PREFIX        prepended to every stream, group and table name (default demo_<unix nanoseconds>_,
//	              fresh for each run; give copies of the service the same one)
//
// Usage:
//
//	go run ./http          # the demo: exits non-zero if one of its claims is false
//	go run ./http -serve   # the service alone
//
//	curl -i -X POST localhost:8080/orders -H 'Idempotency-Key: "k-1"' -H 'X-Customer: ada' \
//	     -d '{"item":"book","amount_cents":1200}'
//	curl -i localhost:8080/orders/<order_id>   # the Location of the 201
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
	"github.com/watermill-idempotency/idempotency/httpidem"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

const (
	// leaseTTL: a request's (and a charge's) lease. A retry of a request
	// whose process died is answered 409 until it runs out, then runs.
	leaseTTL = 2 * time.Second
	// maxIdleTime: Redis Streams hands an entry pending this long (its
	// consumer died) to another consumer.
	maxIdleTime = time.Second
	// keyMetadata carries the request's idempotency key on OrderPlaced.
	keyMetadata = "idempotency_key"
	// slowHeader holds how long (a Go duration, at most maxSlow) a
	// request's order waits inside its transaction, before the commit: the
	// demo's concurrent copies arrive meanwhile, and the demo kills the
	// service then. It is no part of the request's fingerprint: a retry
	// without it is the same request.
	slowHeader = "X-Demo-Slow"
	maxSlow    = time.Minute
)

type config struct {
	httpAddr    string
	databaseURL string
	redisAddr   string
	prefix      string
}

// names are the streams and tables of one deployment.
type names struct {
	placed, group                 string // the OrderPlaced stream and the consumer group
	orders, charges, keys, outbox string // tables; the outbox's is watermill_<outbox>
}

func namesFor(prefix string) names {
	return names{
		placed: prefix + "order_placed", group: prefix + "billing",
		orders: prefix + "orders", charges: prefix + "charges", keys: prefix + "keys", outbox: prefix + "outbox",
	}
}

func main() {
	serveOnly := flag.Bool("serve", false, "run the service alone, until SIGINT or SIGTERM: no demo, no check")
	flag.Parse()
	cfg := config{
		httpAddr:    env("HTTP_ADDR", "127.0.0.1:8080"),
		databaseURL: env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		redisAddr:   env("REDIS_ADDR", "127.0.0.1:6379"),
		prefix:      env("PREFIX", fmt.Sprintf("demo_%d_", time.Now().UnixNano())),
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if *serveOnly {
		err = serve(ctx, cfg)
	} else {
		err = runDemo(ctx, cfg)
	}
	stop()
	if err != nil {
		fmt.Println("http example:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// orderRequest is POST /orders's body; order is its answer and the
// OrderPlaced message.
type orderRequest struct {
	Item        string `json:"item"`
	AmountCents int64  `json:"amount_cents"`
}

type order struct {
	ID          string `json:"order_id"`
	Customer    string `json:"customer"`
	Item        string `json:"item"`
	AmountCents int64  `json:"amount_cents"`
}

// serve runs the service until ctx ends, then shuts it down gracefully.
func serve(ctx context.Context, cfg config) error {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{ReplaceAttr: withoutTime}))
	wmLogger := watermill.NewSlogLoggerWithLevelMapping(logger, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
	brokerLogger := quietOnShutdown{wmLogger, ctx} // the subscriber's and the Forwarder's
	n := namesFor(cfg.prefix)

	// The database: leases, orders, charges and the outbox, in one Postgres.
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
	outbox, err := sqloutbox.NewPostgres(pool, store, sqloutbox.Options{Topic: n.outbox})
	if err != nil {
		return err
	}
	if err := outbox.Migrate(ctx); err != nil {
		return err
	}
	// No unique constraints: the transactions, not the tables, keep an
	// order from being created or charged twice.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+n.orders+` (
		id text NOT NULL, customer text NOT NULL, item text NOT NULL, amount_cents bigint NOT NULL,
		idempotency_key text NOT NULL, fencing_token bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE IF NOT EXISTS `+n.charges+` (
		order_id text NOT NULL, amount_cents bigint NOT NULL, fencing_token bigint NOT NULL,
		charged_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}

	// The API: POST /orders behind the Idempotency-Key middleware.
	api, err := idempotency.New(idempotency.Config{
		Store:     store,
		Namespace: "orders-api",
		LeaseTTL:  leaseTTL,
		Retention: 24 * time.Hour, // the expiry policy: a key is kept a day after its response
		Logger:    wmLogger,
	})
	if err != nil {
		return err
	}
	keys, err := httpidem.New(httpidem.Config{
		Idempotency: api,
		Required:    true,
		Scope: func(r *http.Request) (string, error) {
			if c := r.Header.Get("X-Customer"); c != "" {
				return c, nil // in a real API: the authenticated account
			}
			return "", errors.New("no X-Customer header")
		},
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", keys.Handler(createOrder(logger, outbox, n)))
	mux.Handle("GET /orders/{id}", getOrder(pool, n)) // a read: no key needed
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })

	// The consumer: charges each placed order once, keyed by the request's
	// idempotency key that OrderPlaced carries. The charge row and the
	// completion of that key commit in one transaction (the outbox's
	// Handler, with nothing to publish): a charge whose lease was taken
	// over (the fencing token moved on) cannot complete, and rolls back.
	rdb := redis.NewClient(&redis.Options{Addr: cfg.redisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", cfg.redisAddr, err)
	}
	host, _ := os.Hostname()
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:                        redis.NewClient(&redis.Options{Addr: cfg.redisAddr, ContextTimeoutEnabled: true}),
		Consumer:                      fmt.Sprintf("%s-%d", host, os.Getpid()),
		ConsumerGroup:                 n.group,
		MaxIdleTime:                   maxIdleTime,
		ClaimInterval:                 maxIdleTime / 10,
		NackResendSleep:               100 * time.Millisecond,
		DisableIndefiniteInitialBlock: true,
	}, brokerLogger)
	if err != nil {
		return err
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: rdb}, wmLogger)
	if err != nil {
		return err
	}
	billing, err := idempotency.New(idempotency.Config{
		Store:     store,
		Key:       keyfunc.Metadata(keyMetadata),
		Namespace: "charge",
		LeaseTTL:  3 * maxIdleTime,
		// The key is the request's, namespace included (up to the API's
		// MaxKeyBytes, 512), under this namespace: room for both.
		MaxKeyBytes: 1024,
		Logger:      wmLogger,
	})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, wmLogger)
	if err != nil {
		return err
	}
	charge := router.AddConsumerHandler("charge", n.placed, sub, outbox.Handler(
		func(tx *sqloutbox.PgxTx, msg *message.Message) error {
			var o order
			if err := json.Unmarshal(msg.Payload, &o); err != nil {
				return idempotency.Permanent(err)
			}
			lease, _ := idempotency.LeaseFromContext(msg.Context())
			logger.Info("charging", "order", o.ID, "amount_cents", o.AmountCents, "key", lease.Key, "fencing_token", lease.Token)
			_, err := tx.Exec(msg.Context(), `INSERT INTO `+n.charges+` (order_id, amount_cents, fencing_token) VALUES ($1, $2, $3)`,
				o.ID, o.AmountCents, lease.Token)
			return err
		}))
	charge.AddMiddleware(billing.Middleware) // the outbox completes the key in the transaction

	// The Forwarder: the outbox table to the OrderPlaced stream, each
	// message at least once, under its own UUID.
	fwd, err := outbox.NewForwarder(pub, brokerLogger, forwarder.Config{})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.httpAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	logger.Info("listening", "addr", ln.Addr().String(), "orders", n.orders, "stream", n.placed)
	httpDone := make(chan error, 1)
	go func() { httpDone <- srv.Serve(ln) }()
	fwdDone := make(chan error, 1)
	go func() { fwdDone <- fwd.Run(ctx) }()
	err = router.Run(ctx)

	shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = errors.Join(err, srv.Shutdown(shutdown), fwd.Close(), <-fwdDone)
	if herr := <-httpDone; !errors.Is(herr, http.ErrServerClosed) {
		err = errors.Join(err, herr)
	}
	if err != nil {
		return err
	}
	logger.Info("shut down: no request or handler running")
	return nil
}

// createOrder is POST /orders: the order row, its OrderPlaced message and
// the 201 response, in one transaction that also completes the request's
// key (contrib/sqloutbox's WithTx): a retry gets this 201 back, and
// nothing of a request that failed is kept.
func createOrder(logger *slog.Logger, outbox *sqloutbox.Postgres, n names) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req orderRequest
		slow, err := time.ParseDuration(cmp.Or(r.Header.Get(slowHeader), "0s"))
		if err == nil && (slow < 0 || slow > maxSlow) {
			err = fmt.Errorf("%s: %v is not between 0 and %v", slowHeader, slow, maxSlow)
		}
		if err == nil {
			err = json.NewDecoder(r.Body).Decode(&req)
		}
		if err != nil || req.Item == "" || req.AmountCents <= 0 {
			// A 4xx is stored too: the same request stays invalid.
			http.Error(w, `want {"item":"…","amount_cents":N}, N > 0`, http.StatusBadRequest)
			return
		}
		// The request's key as the store holds it: the namespace, the
		// route, the customer (Config.Scope) and the client's key. It goes
		// with OrderPlaced, and the consumer charges under it.
		lease, _ := idempotency.LeaseFromContext(r.Context())
		key := lease.Key
		o := order{ID: watermill.NewUUID(), Customer: r.Header.Get("X-Customer"), Item: req.Item, AmountCents: req.AmountCents}
		err = outbox.WithTx(r.Context(), func(tx *sqloutbox.PgxTx) error {
			if _, err := tx.Exec(r.Context(), `INSERT INTO `+n.orders+` (id, customer, item, amount_cents, idempotency_key, fencing_token)
				VALUES ($1, $2, $3, $4, $5, $6)`, o.ID, o.Customer, o.Item, o.AmountCents, key, lease.Token); err != nil {
				return err
			}
			payload, err := json.Marshal(o)
			if err != nil {
				return err
			}
			placed := message.NewMessage(o.ID, payload)
			placed.Metadata.Set(keyMetadata, key)
			if err := tx.Publish(n.placed, placed); err != nil {
				return err
			}
			if slow > 0 { // the demo's copies arrive, or the demo kills the service, meanwhile
				logger.Info("a slow order, inside its transaction", "order", o.ID, "for", slow, "fencing_token", lease.Token)
				select {
				case <-time.After(slow):
				case <-r.Context().Done():
					return r.Context().Err()
				}
			}
			// The response, before the commit: the key is completed with
			// it, in this transaction.
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/orders/"+o.ID)
			w.WriteHeader(http.StatusCreated)
			return json.NewEncoder(w).Encode(o)
		})
		if err != nil {
			// Nothing was recorded: discard the 201 the transaction wrote;
			// a 5xx releases the key, so the client's retry runs again.
			httpidem.Reset(w)
			logger.Warn("order failed", "error", err)
			http.Error(w, "the order could not be recorded; retry it with the same Idempotency-Key", http.StatusServiceUnavailable)
			return
		}
		logger.Info("order created", "order", o.ID, "key", key, "fencing_token", lease.Token)
	}
}

// getOrder is GET /orders/{id}: the order as its 201 said, or 404.
func getOrder(pool *pgxpool.Pool, n names) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		o := order{ID: r.PathValue("id")}
		err := pool.QueryRow(r.Context(), `SELECT customer, item, amount_cents FROM `+n.orders+` WHERE id = $1`, o.ID).
			Scan(&o.Customer, &o.Item, &o.AmountCents)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			http.Error(w, "no such order", http.StatusNotFound)
			return
		case err != nil:
			http.Error(w, "the order could not be read; retry", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(o)
	}
}

// quietOnShutdown logs at debug the errors logged once ctx is done: the
// shutdown cancels the calls in progress (the Forwarder's query of the
// outbox table, the subscriber's read of the stream), and their libraries
// log the cancellation, or the commit that fails after it, as an error.
// What was cut short is done again after the next start: an outbox row
// not marked is forwarded again, an entry not acked is claimed.
type quietOnShutdown struct {
	watermill.LoggerAdapter
	ctx context.Context
}

func (l quietOnShutdown) Error(msg string, err error, fields watermill.LogFields) {
	if l.ctx.Err() != nil {
		l.LoggerAdapter.Debug(msg+": "+err.Error(), fields)
		return
	}
	l.LoggerAdapter.Error(msg, err, fields)
}

func (l quietOnShutdown) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return quietOnShutdown{l.LoggerAdapter.With(fields), l.ctx}
}

// withoutTime drops the time from log lines: they are read in order.
func withoutTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
