package main

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	_ "github.com/go-sql-driver/mysql" // the driver mysqlstore's *sql.DB uses
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// server names a server a variant's store uses besides Redis, whose CPU
// counts towards the variant's.
type server int

const (
	noServer server = iota
	postgresServer
	mariadbServer
)

// variant is one way of consuming the stream.
type variant struct {
	name string
	// once: must run the handler exactly once per key; a run that does
	// not fails the benchmark.
	once bool
	// peer: a hand-written lease (peers.go), not this middleware.
	peer bool
	// server is the store's server besides Redis, if any.
	server server
	// setup returns the router middleware for one run, on a keyspace or
	// table named after id and reporting to obs if it is this middleware,
	// and what undoes it once the router is closed.
	setup func(ctx context.Context, e *env, id string, obs idempotency.Observer) (message.HandlerMiddleware, func(), error)
}

// variants are every variant, in the order they run in the first round.
var variants = []variant{
	{name: "none", setup: func(context.Context, *env, string, idempotency.Observer) (message.HandlerMiddleware, func(), error) {
		return nil, func() {}, nil
	}},
	{name: "deduplicator", setup: func(context.Context, *env, string, idempotency.Observer) (message.HandlerMiddleware, func(), error) {
		// Keyed by UUID as the duplicates are; its default repository, in
		// memory, shared by the four handlers. Every field is set: its
		// Middleware writes the defaults of unset ones into d, which races
		// when the router applies it to four handlers at once, and would
		// give each handler a repository of its own.
		repo, err := wmmiddleware.NewMapExpiringKeyRepository(time.Minute)
		if err != nil {
			return nil, nil, err
		}
		d := &wmmiddleware.Deduplicator{
			KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil },
			Repository: repo,
			Timeout:    time.Minute,
		}
		return d.Middleware, func() {}, nil
	}},
	{name: "memstore", once: true, setup: func(_ context.Context, e *env, _ string, obs idempotency.Observer) (message.HandlerMiddleware, func(), error) {
		store, err := memstore.New(memstore.Options{})
		if err != nil {
			return nil, nil, err
		}
		return e.middleware(store, obs, idempotency.CompletedCache{}, func() {})
	}},
	{name: "redis-setnx", once: true, peer: true, setup: setupSetnx},
	{name: "redis-cas", once: true, peer: true, setup: setupCas},
	{name: "redisstore", once: true, setup: setupRedisstore(redisstore.CoalesceConcurrent, idempotency.CompletedCache{})},
	{name: "redisstore-off", once: true, setup: setupRedisstore(redisstore.CoalesceOff, idempotency.CompletedCache{})},
	{name: "redisstore-cache", once: true, setup: setupRedisstore(redisstore.CoalesceConcurrent, completedCache)},
	{name: "pg-insert", once: true, peer: true, server: postgresServer, setup: setupInsert(false)},
	{name: "pg-cas", once: true, peer: true, server: postgresServer, setup: setupInsert(true)},
	{name: "pgstore", once: true, server: postgresServer, setup: setupPgstore(idempotency.CompletedCache{})},
	{name: "pgstore-cache", once: true, server: postgresServer, setup: setupPgstore(completedCache)},
	{name: "mysql-insert", once: true, peer: true, server: mariadbServer, setup: setupMysqlInsert(false)},
	{name: "mysql-cas", once: true, peer: true, server: mariadbServer, setup: setupMysqlInsert(true)},
	{name: "mysqlstore", once: true, server: mariadbServer, setup: setupMysqlstore(idempotency.CompletedCache{})},
	{name: "mysqlstore-cache", once: true, server: mariadbServer, setup: setupMysqlstore(completedCache)},
}

func variantNames() []string {
	names := make([]string, len(variants))
	for i, v := range variants {
		names[i] = v.name
	}
	return names
}

func lookupVariant(name string) (variant, bool) {
	for _, v := range variants {
		if v.name == name {
			return v, true
		}
	}
	return variant{}, false
}

// completedCache is the completed-key cache of the -cache variants, as
// docs/configuration.md sets it up: room for every key of a run, each
// trusted for a minute.
var completedCache = idempotency.CompletedCache{Size: 100_000, TTL: time.Minute}

// middleware is this middleware on store, as one service sets it up for
// all its handlers: one instance, one namespace, since the handlers are
// copies competing for the stream's entries; an observer counts the
// outcomes, as a service's metrics would; cache is its completed-key
// cache (the zero value: none).
func (e *env) middleware(store backends.Store, obs idempotency.Observer, cache idempotency.CompletedCache, undo func()) (message.HandlerMiddleware, func(), error) {
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "orders", Observer: obs, CompletedCache: cache})
	if err != nil {
		undo()
		return nil, nil, err
	}
	return idem.Middleware, undo, nil
}

// poolSize is the store's own pool: twice the consumers, so that the
// middleware's bound on acquisitions in flight (half the pool) lets every
// consumer acquire at once.
func (e *env) poolSize() int { return 2 * e.cfg.consumers }

// setupRedisstore returns the setup of the store with coalescing and
// the middleware with cache: a client of its own on the stream's Redis
// (docs/redis.md), its keys under a prefix of the run's.
func setupRedisstore(coalescing redisstore.Coalescing, cache idempotency.CompletedCache) func(context.Context, *env, string, idempotency.Observer) (message.HandlerMiddleware, func(), error) {
	return func(ctx context.Context, e *env, id string, obs idempotency.Observer) (message.HandlerMiddleware, func(), error) {
		client := redis.NewClient(&redis.Options{Addr: e.cfg.redisAddr, ContextTimeoutEnabled: true, PoolSize: e.poolSize()})
		prefix := e.name(id, "idem") + ":"
		store, err := redisstore.New(client, redisstore.Options{Prefix: prefix, Coalescing: coalescing})
		if err != nil {
			client.Close()
			return nil, nil, err
		}
		if err := client.Ping(ctx).Err(); err != nil {
			client.Close()
			return nil, nil, err
		}
		return e.middleware(store, obs, cache, func() {
			_ = store.Close()
			_ = client.Close()
			e.deleteKeys(prefix + "*")
		})
	}
}

// setupPgstore returns the setup of the store, with the middleware's
// cache: a pool of its own (docs/postgres.md) and a table in a schema of
// the run's, dropped afterwards.
func setupPgstore(cache idempotency.CompletedCache) func(context.Context, *env, string, idempotency.Observer) (message.HandlerMiddleware, func(), error) {
	return func(ctx context.Context, e *env, id string, obs idempotency.Observer) (message.HandlerMiddleware, func(), error) {
		pool, err := e.pgPool(ctx, "pgstore")
		if err != nil {
			return nil, nil, err
		}
		schema := sqlName(e.name(id))
		store, err := pgstore.New(pool, pgstore.Options{Schema: schema, InFlight: e.cfg.pgInFlight})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		undo := func() {
			_ = store.Close()
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			pool.Close()
		}
		return e.sqlMiddleware(ctx, store, func() error { return warmPool(ctx, pool, e.poolSize()) }, obs, cache, undo)
	}
}

// sqlStore is a SQL store, whose table a run creates.
type sqlStore interface {
	backends.Store
	Migrate(ctx context.Context) error
}

// sqlMiddleware migrates store and opens its connections (warm), as a
// running service has them, then returns the middleware on it; undo drops
// what the setup made, on failure too.
func (e *env) sqlMiddleware(ctx context.Context, store sqlStore, warm func() error, obs idempotency.Observer, cache idempotency.CompletedCache, undo func()) (message.HandlerMiddleware, func(), error) {
	if err := store.Migrate(ctx); err != nil {
		undo()
		return nil, nil, err
	}
	if err := warm(); err != nil {
		undo()
		return nil, nil, err
	}
	return e.middleware(store, obs, cache, undo)
}

// pgPool returns a pool of its own for variant, of poolSize connections.
func (e *env) pgPool(ctx context.Context, variant string) (*pgxpool.Pool, error) {
	if e.cfg.pgURL == "" {
		return nil, errors.New(variant + " needs -pg")
	}
	cfg, err := pgxpool.ParseConfig(e.cfg.pgURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(e.poolSize())
	return pgxpool.NewWithConfig(ctx, cfg)
}

// warmPool opens n of pool's connections now: a service's are open long
// before these messages arrive, and a Postgres connection is a process.
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// setupMysqlstore returns the setup of the store, with the middleware's
// cache: a *sql.DB of its own with a limit (docs/mysql.md) and a table of
// the run's, dropped afterwards.
func setupMysqlstore(cache idempotency.CompletedCache) func(context.Context, *env, string, idempotency.Observer) (message.HandlerMiddleware, func(), error) {
	return func(ctx context.Context, e *env, id string, obs idempotency.Observer) (message.HandlerMiddleware, func(), error) {
		db, err := e.mysqlDB("mysqlstore")
		if err != nil {
			return nil, nil, err
		}
		table := sqlName(e.name(id))
		store, err := mysqlstore.New(db, mysqlstore.Options{Table: table})
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		undo := func() {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+table+"`")
			db.Close()
		}
		return e.sqlMiddleware(ctx, store, func() error { return warmDB(ctx, db, e.poolSize()) }, obs, cache, undo)
	}
}

// mysqlDB returns a *sql.DB of its own for variant, of poolSize
// connections.
func (e *env) mysqlDB(variant string) (*sql.DB, error) {
	if e.cfg.mysqlDSN == "" {
		return nil, errors.New(variant + " needs -mysql")
	}
	db, err := sql.Open("mysql", e.cfg.mysqlDSN)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(e.poolSize())
	db.SetMaxIdleConns(e.poolSize())
	return db, nil
}

// warmDB opens n of db's connections now, as a running service has them.
func warmDB(ctx context.Context, db *sql.DB, n int) error {
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}
