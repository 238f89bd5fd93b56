package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
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
	mysqlDSN     string
	mysqlTable   string
	dynamoTable  string
	// dynamoEndpoint replaces the AWS endpoint, for LocalStack or dynalite.
	dynamoEndpoint string
	// dynamoClockSkew must be the services' dynamostore.Options.ClockSkew:
	// idem judges leases by its own clock with that margin, as they do.
	dynamoClockSkew time.Duration
	output          string
	timeout         time.Duration
	// envErrs are the IDEM_* variables that could not be read.
	envErrs []error
}

// register adds the global flags to fs, with defaults from the environment.
func (g *globals) register(fs *flag.FlagSet) {
	env := func(name, def string) string {
		if v, ok := os.LookupEnv(name); ok {
			return v
		}
		return def
	}
	fs.StringVar(&g.store, "store", env("IDEM_STORE", ""), "the store: redis, postgres, mysql or dynamodb (IDEM_STORE; default postgres if --pg-url is set, mysql if --mysql-dsn is, else redis)")
	fs.StringVar(&g.redisURL, "redis-url", env("IDEM_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL (IDEM_REDIS_URL)")
	fs.StringVar(&g.redisCluster, "redis-cluster", env("IDEM_REDIS_CLUSTER", ""), "comma-separated Redis Cluster addresses, instead of --redis-url (IDEM_REDIS_CLUSTER)")
	fs.StringVar(&g.redisPrefix, "redis-prefix", env("IDEM_REDIS_PREFIX", redisstore.DefaultPrefix), "the store's Redis key prefix (IDEM_REDIS_PREFIX)")
	fs.StringVar(&g.pgURL, "pg-url", env("IDEM_PG_URL", ""), "Postgres URL (IDEM_PG_URL)")
	fs.StringVar(&g.pgSchema, "pg-schema", env("IDEM_PG_SCHEMA", pgstore.DefaultSchema), "the store's Postgres schema (IDEM_PG_SCHEMA)")
	fs.StringVar(&g.pgTable, "pg-table", env("IDEM_PG_TABLE", pgstore.DefaultTable), "the store's Postgres table (IDEM_PG_TABLE)")
	fs.StringVar(&g.mysqlDSN, "mysql-dsn", env("IDEM_MYSQL_DSN", ""), "MySQL or MariaDB DSN, as go-sql-driver/mysql takes it: user:password@tcp(host:3306)/db (IDEM_MYSQL_DSN)")
	fs.StringVar(&g.mysqlTable, "mysql-table", env("IDEM_MYSQL_TABLE", mysqlstore.DefaultTable), "the store's MySQL table, optionally db.table (IDEM_MYSQL_TABLE)")
	fs.StringVar(&g.dynamoTable, "dynamo-table", env("IDEM_DYNAMO_TABLE", dynamostore.DefaultTable), "the store's DynamoDB table (IDEM_DYNAMO_TABLE)")
	fs.StringVar(&g.dynamoEndpoint, "dynamo-endpoint", env("IDEM_DYNAMO_ENDPOINT", ""), "DynamoDB endpoint URL, for LocalStack or dynalite; the region and credentials come from the AWS environment and config files (IDEM_DYNAMO_ENDPOINT)")
	// A malformed duration in the environment is reported by validate,
	// not replaced by the default.
	duration := func(name string, def time.Duration) time.Duration {
		v := env(name, "")
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			g.envErrs = append(g.envErrs, fmt.Errorf("%s: %w", name, err))
			return def
		}
		return d
	}
	skew := duration("IDEM_DYNAMO_CLOCK_SKEW", dynamostore.DefaultClockSkew)
	fs.DurationVar(&g.dynamoClockSkew, "dynamo-clock-skew", skew, "the services' dynamostore.Options.ClockSkew (IDEM_DYNAMO_CLOCK_SKEW)")
	out := env("IDEM_OUTPUT", "table")
	fs.StringVar(&g.output, "o", out, "output format: table or json (IDEM_OUTPUT)")
	fs.StringVar(&g.output, "output", out, "output format: table or json (IDEM_OUTPUT)")
	timeout := duration("IDEM_TIMEOUT", 10*time.Second)
	fs.DurationVar(&g.timeout, "timeout", timeout, "bound on the whole command (IDEM_TIMEOUT)")
}

func (g *globals) validate() error {
	if len(g.envErrs) > 0 {
		return usageError{errors.Join(g.envErrs...)}
	}
	if g.output != "table" && g.output != "json" {
		return usageError{fmt.Errorf("-o must be table or json, got %q", g.output)}
	}
	if g.store == "" {
		switch {
		case g.pgURL != "" && g.mysqlDSN != "":
			return usageError{errors.New("both --pg-url and --mysql-dsn are set: choose the store with --store")}
		case g.pgURL != "":
			g.store = "postgres"
		case g.mysqlDSN != "":
			g.store = "mysql"
		default:
			g.store = "redis"
		}
	}
	switch g.store {
	case "redis", "postgres", "mysql", "dynamodb":
	default:
		return usageError{fmt.Errorf("--store must be redis, postgres, mysql or dynamodb, got %q", g.store)}
	}
	if g.timeout <= 0 {
		return usageError{fmt.Errorf("--timeout must be positive, got %v", g.timeout)}
	}
	return nil
}

// operatorStore is what the commands need from a store: every store
// here implements both.
type operatorStore interface {
	backends.Store
	backends.Lister
}

// sqlStore is what `idem pg` and `idem mysql` need from their store.
type sqlStore interface {
	Migrate(ctx context.Context) error
	Schema() string
	Cleanup(ctx context.Context, batch int) (int64, error)
}

var (
	_ sqlStore = (*pgstore.Store)(nil)
	_ sqlStore = (*mysqlstore.Store)(nil)
)

// openStore connects to the store the flags name and checks that it
// answers and, when needTable is set (every command but those that create
// the table), that its table exists. The caller calls the returned
// function when done.
func openStore(ctx context.Context, g *globals, needTable bool) (operatorStore, func(), error) {
	switch g.store {
	case "postgres":
		return openPostgres(ctx, g, needTable)
	case "mysql":
		return openMySQL(ctx, g, needTable)
	case "dynamodb":
		return openDynamo(ctx, g, needTable)
	default:
		return openRedis(ctx, g)
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
			return nil, nil, usageError{fmt.Errorf("--redis-url %q: %w", redactURL(g.redisURL), err)}
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

// newPostgres returns the store the flags name, without connecting.
func newPostgres(g *globals) (*pgstore.Store, *pgxpool.Pool, *pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(g.pgURL)
	if err != nil {
		return nil, nil, nil, usageError{fmt.Errorf("--pg-url %q: %w", redactURL(g.pgURL), err)}
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg) // connects only when used
	if err != nil {
		return nil, nil, nil, err
	}
	s, err := pgstore.New(pool, pgstore.Options{Schema: g.pgSchema, Table: g.pgTable})
	if err != nil {
		pool.Close()
		return nil, nil, nil, usageError{err}
	}
	return s, pool, cfg, nil
}

func openPostgres(ctx context.Context, g *globals, needTable bool) (operatorStore, func(), error) {
	if g.pgURL == "" {
		return nil, nil, usageError{errors.New("--pg-url (IDEM_PG_URL) is required for the postgres store")}
	}
	s, pool, cfg, err := newPostgres(g)
	if err != nil {
		return nil, nil, err
	}
	where := fmt.Sprintf("Postgres at %s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("%s does not answer: %w", where, err)
	}
	if needTable {
		table := pgx.Identifier{g.pgSchema, g.pgTable}.Sanitize()
		var found *string
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1)::text`, table).Scan(&found); err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("%s: %w", where, err)
		}
		if found == nil {
			pool.Close()
			return nil, nil, fmt.Errorf("%s has no table %s: check --pg-schema and --pg-table, or create it with `idem pg migrate`", where, table)
		}
	}
	return s, pool.Close, nil
}

// newMySQL returns the store the flags name, without connecting. With
// offline set an empty DSN is accepted: the schema depends on the table
// alone.
func newMySQL(g *globals, offline bool) (*mysqlstore.Store, *sql.DB, *mysql.Config, error) {
	cfg := mysql.NewConfig()
	switch {
	case g.mysqlDSN != "":
		var err error
		if cfg, err = mysql.ParseDSN(g.mysqlDSN); err != nil {
			// The driver's errors quote parameters, never the password.
			return nil, nil, nil, usageError{fmt.Errorf("--mysql-dsn %q: %w", redactDSN(g.mysqlDSN), err)}
		}
	case !offline:
		return nil, nil, nil, usageError{errors.New("--mysql-dsn (IDEM_MYSQL_DSN) is required for the mysql store")}
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, nil, nil, usageError{fmt.Errorf("--mysql-dsn %q: %w", redactDSN(g.mysqlDSN), err)}
	}
	db := sql.OpenDB(connector) // connects only when used
	db.SetMaxOpenConns(2)
	s, err := mysqlstore.New(db, mysqlstore.Options{Table: g.mysqlTable})
	if err != nil {
		db.Close()
		return nil, nil, nil, usageError{err}
	}
	return s, db, cfg, nil
}

func openMySQL(ctx context.Context, g *globals, needTable bool) (operatorStore, func(), error) {
	s, db, cfg, err := newMySQL(g, false)
	if err != nil {
		return nil, nil, err
	}
	where := "MySQL at " + cfg.Addr
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		var refused *mysql.MySQLError
		if errors.As(err, &refused) { // it answered: access denied, unknown database...
			return nil, nil, fmt.Errorf("%s: %w", where, err)
		}
		return nil, nil, fmt.Errorf("%s does not answer: %w", where, err)
	}
	if needTable {
		if err := mysqlTableExists(ctx, db, where, s.Options().Table); err != nil {
			db.Close()
			return nil, nil, err
		}
	}
	return s, func() { db.Close() }, nil
}

// mysqlTableExists checks that table ("table" or "db.table") exists, in
// the DSN's database unless it names its own.
func mysqlTableExists(ctx context.Context, db *sql.DB, where, table string) error {
	schema, name, qualified := strings.Cut(table, ".")
	if !qualified {
		schema, name = "", table
	}
	var current sql.NullString
	var found bool
	err := db.QueryRowContext(ctx, `SELECT DATABASE(), EXISTS(SELECT 1 FROM information_schema.tables
		WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?)`, schema, name).Scan(&current, &found)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if schema == "" {
		if !current.Valid {
			return usageError{fmt.Errorf("%s: the DSN names no database: end --mysql-dsn with /DBNAME, or give --mysql-table as db.table", where)}
		}
		schema = current.String
	}
	if !found {
		return fmt.Errorf("%s has no table `%s`.`%s`: check --mysql-table and the DSN's database, or create it with `idem mysql migrate`", where, schema, name)
	}
	return nil
}

// redactDSN hides a go-sql-driver DSN's password: what lies between the
// first ':' and the last '@' ([user[:password]@][net[(addr)]]/db?params).
// It may hide more than the password (an '@' in a parameter), never less.
func redactDSN(dsn string) string {
	at := strings.LastIndexByte(dsn, '@')
	if at < 0 {
		return dsn
	}
	colon := strings.IndexByte(dsn[:at], ':')
	if colon < 0 {
		return dsn
	}
	return dsn[:colon+1] + "xxxxx" + dsn[at:]
}

func openDynamo(ctx context.Context, g *globals, needTable bool) (operatorStore, func(), error) {
	where := "DynamoDB"
	if g.dynamoEndpoint != "" {
		u, err := url.Parse(g.dynamoEndpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, nil, usageError{fmt.Errorf("--dynamo-endpoint %q: want http://host:port or https://host", redactURL(g.dynamoEndpoint))}
		}
		where = "DynamoDB at " + u.Redacted()
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, nil, usageError{errors.New("no AWS region for the dynamodb store: set AWS_REGION, or a region in the AWS profile")}
	}
	if g.dynamoEndpoint == "" {
		where += " in " + cfg.Region
	}
	// Asked for now, so that missing credentials are not reported as a
	// server that does not answer.
	if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
		return nil, nil, fmt.Errorf("no AWS credentials for %s: %w", where, err)
	}
	client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if g.dynamoEndpoint != "" {
			o.BaseEndpoint = aws.String(g.dynamoEndpoint)
		}
	})
	s, err := dynamostore.New(client, dynamostore.Options{Table: g.dynamoTable, ClockSkew: g.dynamoClockSkew})
	if err != nil {
		return nil, nil, usageError{err}
	}
	if needTable {
		_, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(g.dynamoTable)})
		var missing *types.ResourceNotFoundException
		var answered smithy.APIError
		switch {
		case errors.As(err, &missing):
			return nil, nil, fmt.Errorf("%s has no table %s: check --dynamo-table and the region, or create it with `idem dynamodb create-table`", where, g.dynamoTable)
		case errors.As(err, &answered):
			return nil, nil, fmt.Errorf("%s: %w", where, err)
		case err != nil:
			return nil, nil, fmt.Errorf("%s does not answer: %w", where, err)
		}
	}
	return s, func() {}, nil
}

// redactURL hides a URL's password.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}

// printSchema prints the SQL that `idem pg migrate` or `idem mysql
// migrate` runs, without connecting.
func printSchema(e *env) error {
	var schema string
	switch e.g.store {
	case "mysql":
		s, db, _, err := newMySQL(e.g, true)
		if err != nil {
			return err
		}
		defer db.Close()
		schema = s.Schema()
	default:
		s, pool, _, err := newPostgres(e.g)
		if err != nil {
			return err
		}
		defer pool.Close()
		schema = s.Schema()
	}
	_, err := fmt.Fprintln(e.stdout, strings.TrimSpace(schema))
	return err
}
