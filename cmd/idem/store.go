package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/logging"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
)

// globals are the flags every command takes.
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
	// dynamoTTL is what `idem dynamodb migrate` does with Time to Live.
	dynamoTTL dynamostore.TTL
	output    string
	timeout   time.Duration
	// where names the store once openStore knows it ("Redis at
	// 127.0.0.1:6379"), for describe.
	where string
}

// register adds the global flags to fs. Their variables are applied by
// fromEnv, with the command's own flags.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.store, "store", "", "the store: redis, postgres, mysql or dynamodb (default postgres if --pg-url is set, mysql if --mysql-dsn is, else redis)")
	fs.StringVar(&g.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis URL")
	fs.StringVar(&g.redisCluster, "redis-cluster", "", "comma-separated Redis Cluster addresses, instead of --redis-url")
	fs.StringVar(&g.redisPrefix, "redis-prefix", redisstore.DefaultPrefix, "the store's Redis key prefix")
	fs.StringVar(&g.pgURL, "pg-url", "", "Postgres URL")
	fs.StringVar(&g.pgSchema, "pg-schema", pgstore.DefaultSchema, "the store's Postgres schema")
	fs.StringVar(&g.pgTable, "pg-table", pgstore.DefaultTable, "the store's Postgres table")
	fs.StringVar(&g.mysqlDSN, "mysql-dsn", "", "MySQL or MariaDB DSN, as go-sql-driver/mysql takes it: user:password@tcp(host:3306)/db")
	fs.StringVar(&g.mysqlTable, "mysql-table", mysqlstore.DefaultTable, "the store's MySQL table, optionally db.table")
	fs.StringVar(&g.dynamoTable, "dynamo-table", dynamostore.DefaultTable, "the store's DynamoDB table")
	fs.StringVar(&g.dynamoEndpoint, "dynamo-endpoint", "", "DynamoDB endpoint URL, for LocalStack or dynalite; the region and credentials come from the AWS environment and config files")
	fs.DurationVar(&g.dynamoClockSkew, "dynamo-clock-skew", dynamostore.DefaultClockSkew, "the services' dynamostore.Options.ClockSkew")
	fs.StringVar(&g.output, "o", "table", "output format: table or json")
	fs.StringVar(&g.output, "output", "table", "output format: table or json")
	fs.DurationVar(&g.timeout, "timeout", 10*time.Second, "bound on the whole command, every store call included")
}

func (g *globals) validate() error {
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
// (printSchema takes each store's SQL from its own type.)
type sqlStore interface {
	Migrate(ctx context.Context) error
	Cleanup(ctx context.Context, batch int) (int64, error)
}

var (
	_ sqlStore = (*pgstore.Store)(nil)
	_ sqlStore = (*mysqlstore.Store)(nil)
)

// storeOpener opens the store of the commands that work on records; tests
// replace it to run them on a store of their own.
var storeOpener = openStore

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
	// ContextTimeoutEnabled: go-redis's own read and write timeouts (3 s)
	// would otherwise outlast a shorter --timeout.
	if g.redisCluster != "" {
		opts, err := parseRedisCluster(g.redisCluster)
		if err != nil {
			return nil, nil, usageError{err}
		}
		opts.MaxRetries = 1
		opts.ContextTimeoutEnabled = true
		client = redis.NewClusterClient(opts)
		g.where = "the Redis Cluster at " + strings.Join(opts.Addrs, ",")
	} else {
		opts, err := parseRedisURL(g.redisURL)
		if err != nil {
			return nil, nil, usageError{err}
		}
		opts.MaxRetries = 1
		opts.ContextTimeoutEnabled = true
		client = redis.NewClient(opts)
		g.where = "Redis at " + opts.Addr
	}
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return nil, nil, g.describe(ctx, err)
	}
	s, err := redisstore.New(client, redisstore.Options{Prefix: g.redisPrefix})
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return s, func() { client.Close() }, nil
}

// quoted is a flag's value as a message shows it: quoted, its secrets
// replaced.
func quoted(flagName, value string) string { return strconv.Quote(redactValue(flagName, value)) }

// libraryError is the message of err, an error a client library
// returned for the value of a secret flag: without the URL a url.Error
// quotes in full, and with the value's secrets replaced wherever the
// library quoted them.
func libraryError(flagName, value string, err error) string {
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		err = urlErr.Err
	}
	return scrub(err.Error(), secretsIn(flagName, value))
}

// parseRedisURL reads --redis-url as go-redis does; its errors show the
// URL redacted, and say what a URL without a scheme lacks.
func parseRedisURL(s string) (*redis.Options, error) {
	if !strings.Contains(s, "://") {
		return nil, fmt.Errorf("--redis-url %s has no scheme: want a URL such as %s (rediss:// for TLS, unix:///path/to/socket for a socket)",
			quoted("redis-url", s), quoted("redis-url", "redis://"+s))
	}
	opts, err := redis.ParseURL(s)
	if err != nil {
		msg := libraryError("redis-url", s, err)
		if strings.Contains(msg, "invalid URL scheme") {
			return nil, fmt.Errorf("--redis-url %s: %s: want redis://, rediss:// (TLS) or unix://", quoted("redis-url", s), msg)
		}
		return nil, fmt.Errorf("--redis-url %s: %s", quoted("redis-url", s), msg)
	}
	return opts, nil
}

// parseRedisCluster reads --redis-cluster: addresses, host:port,...; or,
// for a user and password, a URL as go-redis's ParseClusterURL takes it:
// redis://user:password@host:port?addr=host2:port2&addr=host3:port3.
func parseRedisCluster(s string) (*redis.ClusterOptions, error) {
	if strings.Contains(s, "://") {
		opts, err := redis.ParseClusterURL(s)
		if err != nil {
			return nil, fmt.Errorf("--redis-cluster %s: %s", quoted("redis-cluster", s), libraryError("redis-cluster", s, err))
		}
		return opts, nil
	}
	var addrs []string
	for a := range strings.SplitSeq(s, ",") {
		a = strings.TrimSpace(a)
		if strings.Contains(a, "@") {
			return nil, fmt.Errorf("--redis-cluster %s: an address is host:port; give a user and password as a URL: redis://user:password@host:port?addr=host2:port2",
				quoted("redis-cluster", s))
		}
		if _, _, err := net.SplitHostPort(a); err != nil || a == "" {
			return nil, fmt.Errorf("--redis-cluster %s: want host:port,host:port,... or redis://host:port?addr=host2:port2, got address %s",
				quoted("redis-cluster", s), quoted("redis-cluster", a))
		}
		addrs = append(addrs, a)
	}
	return &redis.ClusterOptions{Addrs: addrs}, nil
}

// newPostgres returns the store the flags name, without connecting.
func newPostgres(g *globals) (*pgstore.Store, *pgxpool.Pool, *pgxpool.Config, error) {
	cfg, err := parsePgURL(g.pgURL)
	if err != nil {
		return nil, nil, nil, usageError{err}
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

// parsePgURL reads --pg-url as pgx does: a URL, postgres://..., or
// keyword/value pairs, host=... dbname=.... Its errors show the value
// redacted, and say what a URL without a scheme lacks.
func parsePgURL(s string) (*pgxpool.Config, error) {
	scheme, _, isURL := strings.Cut(s, "://")
	switch {
	case !isURL && !strings.Contains(s, "="):
		return nil, fmt.Errorf("--pg-url %s has no scheme: want a URL such as %s, or keyword/value pairs (host=... dbname=...)",
			quoted("pg-url", s), quoted("pg-url", "postgres://"+s))
	case isURL && scheme != "postgres" && scheme != "postgresql":
		return nil, fmt.Errorf("--pg-url %s: want a postgres:// or postgresql:// URL", quoted("pg-url", s))
	}
	cfg, err := pgxpool.ParseConfig(s)
	if err != nil {
		// pgx says "cannot parse `<the value, redacted>`: why": the
		// value is quoted once, as the other flags' errors quote it.
		msg := libraryError("pg-url", s, err)
		if rest, ok := strings.CutPrefix(msg, "cannot parse `"); ok {
			if _, why, ok := strings.Cut(rest, "`: "); ok {
				msg = why
			}
		}
		return nil, fmt.Errorf("--pg-url %s: %s", quoted("pg-url", s), msg)
	}
	return cfg, nil
}

func openPostgres(ctx context.Context, g *globals, needTable bool) (operatorStore, func(), error) {
	if g.pgURL == "" {
		return nil, nil, usageError{errors.New("--pg-url (IDEM_PG_URL) is required for the postgres store")}
	}
	s, pool, cfg, err := newPostgres(g)
	if err != nil {
		return nil, nil, err
	}
	g.where = fmt.Sprintf("Postgres at %s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, g.describe(ctx, err)
	}
	if needTable {
		table := pgx.Identifier{g.pgSchema, g.pgTable}.Sanitize()
		var found *string
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1)::text`, table).Scan(&found); err != nil {
			pool.Close()
			return nil, nil, g.describe(ctx, err)
		}
		if found == nil {
			pool.Close()
			return nil, nil, g.failure("%s has no table %s: check --pg-schema and --pg-table, or create it with `idem pg migrate`", g.where, table)
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
		if cfg, err = parseMySQLDSN(g.mysqlDSN); err != nil {
			return nil, nil, nil, usageError{err}
		}
	case !offline:
		return nil, nil, nil, usageError{errors.New("--mysql-dsn (IDEM_MYSQL_DSN) is required for the mysql store")}
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, nil, nil, usageError{fmt.Errorf("--mysql-dsn %s: %s", quoted("mysql-dsn", g.mysqlDSN), libraryError("mysql-dsn", g.mysqlDSN, err))}
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

// parseMySQLDSN reads --mysql-dsn as go-sql-driver/mysql does. Its errors
// show the DSN redacted, and a DSN written as a URL, or with its address
// outside tcp(...), gets the DSN it should be.
func parseMySQLDSN(s string) (*mysql.Config, error) {
	const want = "user:password@tcp(host:3306)/db"
	if _, rest, isURL := strings.Cut(s, "://"); isURL {
		return nil, fmt.Errorf("--mysql-dsn %s is a URL: the driver takes a DSN, %s: here %s",
			quoted("mysql-dsn", s), want, quoted("mysql-dsn", dsnFor(rest)))
	}
	cfg, err := mysql.ParseDSN(s)
	if err == nil {
		switch cfg.Net {
		case "tcp", "tcp4", "tcp6", "unix":
			return cfg, nil
		}
		// The driver dials any network a program registered: idem
		// registers none.
		err = errors.New("the network is not tcp or unix")
	}
	if at := strings.LastIndexByte(s, '@'); at >= 0 && !strings.Contains(s[at:], "(") {
		// user:password@host:3306/db
		return nil, fmt.Errorf("--mysql-dsn %s: the address goes in tcp(...): %s", quoted("mysql-dsn", s), quoted("mysql-dsn", dsnFor(s)))
	}
	return nil, fmt.Errorf("--mysql-dsn %s: %s (want %s)", quoted("mysql-dsn", s), libraryError("mysql-dsn", s, err), want)
}

// dsnFor is the DSN of [user[:password]@]host[:port][/db][?params]: its
// address inside tcp(...).
func dsnFor(s string) string {
	user, addr := "", s
	if at := strings.LastIndexByte(s, '@'); at >= 0 {
		user, addr = s[:at+1], s[at+1:]
	}
	addr, rest, _ := strings.Cut(addr, "/")
	return user + "tcp(" + addr + ")/" + rest
}

func openMySQL(ctx context.Context, g *globals, needTable bool) (operatorStore, func(), error) {
	s, db, cfg, err := newMySQL(g, false)
	if err != nil {
		return nil, nil, err
	}
	g.where = "MySQL at " + cfg.Addr
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, nil, g.describe(ctx, err)
	}
	if needTable {
		if err := mysqlTableExists(ctx, db, g, s.Options().Table); err != nil {
			db.Close()
			return nil, nil, err
		}
	}
	return s, func() { db.Close() }, nil
}

// mysqlTableExists checks that table ("table" or "db.table") exists, in
// the DSN's database unless it names its own.
func mysqlTableExists(ctx context.Context, db *sql.DB, g *globals, table string) error {
	schema, name, qualified := strings.Cut(table, ".")
	if !qualified {
		schema, name = "", table
	}
	var current sql.NullString
	var found bool
	err := db.QueryRowContext(ctx, `SELECT DATABASE(), EXISTS(SELECT 1 FROM information_schema.tables
		WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?)`, schema, name).Scan(&current, &found)
	if err != nil {
		return g.describe(ctx, err)
	}
	if schema == "" {
		if !current.Valid {
			return usageError{fmt.Errorf("%s: the DSN names no database: end --mysql-dsn with /DBNAME, or give --mysql-table as db.table", g.where)}
		}
		schema = current.String
	}
	if !found {
		return g.failure("%s has no table `%s`.`%s`: check --mysql-table and the DSN's database, or create it with `idem mysql migrate`", g.where, schema, name)
	}
	return nil
}

func openDynamo(ctx context.Context, g *globals, needTable bool) (operatorStore, func(), error) {
	where := "DynamoDB"
	if g.dynamoEndpoint != "" {
		u, err := parseDynamoEndpoint(g.dynamoEndpoint)
		if err != nil {
			return nil, nil, usageError{err}
		}
		where = "DynamoDB at " + redactValue("dynamo-endpoint", u.String())
	}
	cfg, err := config.LoadDefaultConfig(ctx, config.WithLogger(logging.Nop{}))
	if err != nil {
		return nil, nil, g.failure("reading the AWS configuration: %v", err)
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
		return nil, nil, g.failure("no AWS credentials for %s: %v", where, err)
	}
	g.where = where
	client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if g.dynamoEndpoint != "" {
			o.BaseEndpoint = aws.String(g.dynamoEndpoint)
		}
	})
	s, err := dynamostore.New(client, dynamostore.Options{Table: g.dynamoTable, ClockSkew: g.dynamoClockSkew, TTL: g.dynamoTTL})
	if err != nil {
		return nil, nil, usageError{err}
	}
	if needTable {
		_, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(g.dynamoTable)})
		var missing *types.ResourceNotFoundException
		switch {
		case errors.As(err, &missing):
			return nil, nil, g.failure("%s has no table %s: check --dynamo-table and the region, or create it with `idem dynamodb migrate`", where, g.dynamoTable)
		case err != nil:
			return nil, nil, g.describe(ctx, err)
		}
	}
	return s, func() {}, nil
}

// parseDynamoEndpoint reads --dynamo-endpoint, an http:// or https://
// URL; its errors show it redacted, and say what one without a scheme
// lacks.
func parseDynamoEndpoint(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		return nil, fmt.Errorf("--dynamo-endpoint %s has no scheme: want a URL such as %s (https:// for TLS)",
			quoted("dynamo-endpoint", s), quoted("dynamo-endpoint", "http://"+s))
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("--dynamo-endpoint %s: %s", quoted("dynamo-endpoint", s), libraryError("dynamo-endpoint", s, err))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--dynamo-endpoint %s: want http://host:port or https://host", quoted("dynamo-endpoint", s))
	}
	return u, nil
}

// storeFailure is a failed store call described for the operator: whether
// the server did not answer or answered with an error.
type storeFailure struct {
	msg string
	err error
}

func (e storeFailure) Error() string { return e.msg }
func (e storeFailure) Unwrap() error { return e.err }

// failure is a store failure idem found itself, such as a missing table.
func (g *globals) failure(format string, args ...any) error {
	return storeFailure{msg: fmt.Sprintf(format, args...)}
}

// describe says what the server did about a failed call made under ctx:
// it did not answer in time (ctx's deadline, --timeout, passed), it
// answered with an error (quoted), or it could not be reached. Usage
// errors, outcomes with their own exit code, requests never sent and
// errors already described pass unchanged, as does every error before
// openStore named the store.
func (g *globals) describe(ctx context.Context, err error) error {
	var usage usageError
	var coded codedError
	var described storeFailure
	if err == nil || g.where == "" || errors.As(err, &usage) || errors.As(err, &coded) || errors.As(err, &described) ||
		errors.Is(err, backends.ErrInvalidRequest) {
		return err
	}
	// First the deadline: a server cancelling a statement because idem
	// gave up on it (Postgres' 57014) answered only because of it.
	if deadline, ok := ctx.Deadline(); ok && (ctx.Err() != nil || !time.Now().Before(deadline)) {
		msg := fmt.Sprintf("%s did not answer within %v (--timeout)", g.where, g.timeout)
		if dial := dialError(err); dial != nil {
			msg += ": " + dial.Error()
		}
		return storeFailure{msg, err}
	}
	if reply, ok := serverReply(err); ok {
		return storeFailure{fmt.Sprintf("%s answered with an error: %q", g.where, reply), err}
	}
	if dial := dialError(err); dial != nil {
		return storeFailure{fmt.Sprintf("%s does not answer: %v", g.where, dial), err}
	}
	return storeFailure{fmt.Sprintf("%s: %v", g.where, err), err}
}

// serverReply returns the error the server answered with, as the server
// worded it, if err holds one.
func serverReply(err error) (string, bool) {
	var redisErr redis.Error
	var pgErr *pgconn.PgError
	var mysqlErr *mysql.MySQLError
	var apiErr smithy.APIError
	switch {
	case errors.As(err, &pgErr):
		return pgErr.Error(), true
	case errors.As(err, &mysqlErr):
		return mysqlErr.Error(), true
	case errors.As(err, &apiErr):
		return apiErr.ErrorCode() + ": " + apiErr.ErrorMessage(), true
	case errors.As(err, &redisErr) && !errors.Is(err, redis.Nil):
		return redisErr.Error(), true
	}
	return "", false
}

// dialError returns the error that kept idem from reaching the server:
// the address refused the connection, could not be routed to or resolved.
func dialError(err error) error {
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return opErr
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return dnsErr
	}
	return nil
}

// quietLibraries silences the loggers of the client libraries: go-redis
// and go-sql-driver/mysql print their own lines on stderr when a server
// does not answer, once per retry, beside the one line idem prints for the
// failure. The AWS SDK is given a silent logger in openDynamo; pgx logs
// nothing unless given a tracer.
func quietLibraries() {
	redis.SetLogger(silentRedis{})
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
}

type silentRedis struct{}

func (silentRedis) Printf(context.Context, string, ...any) {}

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
		schema = s.MigrationSQL()
	default:
		s, pool, _, err := newPostgres(e.g)
		if err != nil {
			return err
		}
		defer pool.Close()
		schema = s.MigrationSQL()
	}
	_, err := fmt.Fprintln(e.stdout, strings.TrimSpace(schema))
	return err
}
