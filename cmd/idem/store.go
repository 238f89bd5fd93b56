package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
)

// globals are the flags every command takes, each defaulting to an IDEM_*
// environment variable.
type globals struct {
	store        string
	redisURL     string
	redisCluster string
	redisPrefix  string
	pgURL        string
	pgSchema     string
	pgTable      string
	output       string
	timeout      time.Duration
}

// register adds the global flags to fs, with defaults from the environment.
func (g *globals) register(fs *flag.FlagSet) {
	env := func(name, def string) string {
		if v, ok := os.LookupEnv(name); ok {
			return v
		}
		return def
	}
	fs.StringVar(&g.store, "store", env("IDEM_STORE", ""), "the store: redis or postgres (IDEM_STORE; default postgres if --pg-url is set, else redis)")
	fs.StringVar(&g.redisURL, "redis-url", env("IDEM_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL (IDEM_REDIS_URL)")
	fs.StringVar(&g.redisCluster, "redis-cluster", env("IDEM_REDIS_CLUSTER", ""), "comma-separated Redis Cluster addresses, instead of --redis-url (IDEM_REDIS_CLUSTER)")
	fs.StringVar(&g.redisPrefix, "redis-prefix", env("IDEM_REDIS_PREFIX", redisstore.DefaultPrefix), "the store's Redis key prefix (IDEM_REDIS_PREFIX)")
	fs.StringVar(&g.pgURL, "pg-url", env("IDEM_PG_URL", ""), "Postgres URL (IDEM_PG_URL)")
	fs.StringVar(&g.pgSchema, "pg-schema", env("IDEM_PG_SCHEMA", pgstore.DefaultSchema), "the store's Postgres schema (IDEM_PG_SCHEMA)")
	fs.StringVar(&g.pgTable, "pg-table", env("IDEM_PG_TABLE", pgstore.DefaultTable), "the store's Postgres table (IDEM_PG_TABLE)")
	out := env("IDEM_OUTPUT", "table")
	fs.StringVar(&g.output, "o", out, "output format: table or json (IDEM_OUTPUT)")
	fs.StringVar(&g.output, "output", out, "output format: table or json (IDEM_OUTPUT)")
	timeout, err := time.ParseDuration(env("IDEM_TIMEOUT", "10s"))
	if err != nil {
		timeout = 10 * time.Second
	}
	fs.DurationVar(&g.timeout, "timeout", timeout, "bound on the whole command (IDEM_TIMEOUT)")
}

func (g *globals) validate() error {
	if g.output != "table" && g.output != "json" {
		return usageError{fmt.Errorf("-o must be table or json, got %q", g.output)}
	}
	if g.store == "" {
		g.store = "redis"
		if g.pgURL != "" {
			g.store = "postgres"
		}
	}
	if g.store != "redis" && g.store != "postgres" {
		return usageError{fmt.Errorf("--store must be redis or postgres, got %q", g.store)}
	}
	if g.timeout <= 0 {
		return usageError{fmt.Errorf("--timeout must be positive, got %v", g.timeout)}
	}
	return nil
}

// operatorStore is what the commands need from a store.
type operatorStore interface {
	backends.Store
	backends.Lister
}

// openStore connects to the store the flags name and checks that it
// answers (and, for Postgres, that its table exists unless migrating).
func openStore(ctx context.Context, g *globals, needTable bool) (operatorStore, *pgstore.Store, func(), error) {
	switch g.store {
	case "postgres":
		return openPostgres(ctx, g, needTable)
	default:
		s, closeFn, err := openRedis(ctx, g)
		return s, nil, closeFn, err
	}
}

func openRedis(ctx context.Context, g *globals) (operatorStore, func(), error) {
	var client redis.UniversalClient
	where := g.redisURL
	if g.redisCluster != "" {
		addrs := strings.Split(g.redisCluster, ",")
		client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: 1})
		where = "the Redis Cluster at " + g.redisCluster
	} else {
		opts, err := redis.ParseURL(g.redisURL)
		if err != nil {
			return nil, nil, usageError{fmt.Errorf("--redis-url %q: %w", g.redisURL, err)}
		}
		opts.MaxRetries = 1
		client = redis.NewClient(opts)
		where = "Redis at " + opts.Addr
	}
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("%s does not answer: %w", where, err)
	}
	s, err := redisstore.New(client, redisstore.Options{Prefix: g.redisPrefix})
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return s, func() { client.Close() }, nil
}

func openPostgres(ctx context.Context, g *globals, needTable bool) (operatorStore, *pgstore.Store, func(), error) {
	if g.pgURL == "" {
		return nil, nil, nil, usageError{errors.New("--pg-url (IDEM_PG_URL) is required for the postgres store")}
	}
	cfg, err := pgxpool.ParseConfig(g.pgURL)
	if err != nil {
		return nil, nil, nil, usageError{fmt.Errorf("--pg-url %q: %w", redactURL(g.pgURL), err)}
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	where := fmt.Sprintf("Postgres at %s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, nil, fmt.Errorf("%s does not answer: %w", where, err)
	}
	s, err := pgstore.New(pool, pgstore.Options{Schema: g.pgSchema, Table: g.pgTable})
	if err != nil {
		pool.Close()
		return nil, nil, nil, usageError{err}
	}
	if needTable {
		table := pgx.Identifier{g.pgSchema, g.pgTable}.Sanitize()
		var found *string
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1)::text`, table).Scan(&found); err != nil {
			pool.Close()
			return nil, nil, nil, fmt.Errorf("%s: %w", where, err)
		}
		if found == nil {
			pool.Close()
			return nil, nil, nil, fmt.Errorf("%s has no table %s: check --pg-schema and --pg-table, or create it with `idem pg migrate`", where, table)
		}
	}
	return s, s, pool.Close, nil
}

// redactURL hides a URL's password.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}

// printSchema prints the SQL of `idem pg migrate` without connecting.
func printSchema(e *env) error {
	cfg, err := pgxpool.ParseConfig(e.g.pgURL)
	if err != nil {
		return usageError{fmt.Errorf("--pg-url %q: %w", redactURL(e.g.pgURL), err)}
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg) // connects only when used: never here
	if err != nil {
		return err
	}
	defer pool.Close()
	s, err := pgstore.New(pool, pgstore.Options{Schema: e.g.pgSchema, Table: e.g.pgTable})
	if err != nil {
		return usageError{err}
	}
	_, err = fmt.Fprintln(e.stdout, strings.TrimSpace(s.Schema()))
	return err
}
