package main

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The tests in this file run the binary against stores that fail: one
// that takes the connection and never answers, one that refuses it, and
// real servers that answer with an error. Each failure is one line on
// stderr that says which it was, and exit code 1.

// noStore clears the variables that choose a store, so that each case
// names its own.
var noStore = []string{"IDEM_STORE=", "IDEM_PG_URL=", "IDEM_REDIS_CLUSTER=", "IDEM_MYSQL_DSN=", "IDEM_DYNAMO_ENDPOINT=", "IDEM_TIMEOUT="}

// hungServer listens on a free loopback port, accepts every connection
// and never answers on it, until the test ends.
func hungServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// awsAt is the environment of the dynamodb store at endpoint, signed with
// the static credentials emulators accept.
func awsAt(endpoint string, extra ...string) []string {
	return append([]string{"IDEM_STORE=dynamodb", "IDEM_DYNAMO_ENDPOINT=" + endpoint,
		"AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"}, extra...)
}

// storesAt returns, for each store, the environment and command line of
// a command that works on records, against the server at addr.
func storesAt(addr string) []struct {
	name string
	env  []string
	args []string
} {
	return []struct {
		name string
		env  []string
		args []string
	}{
		{"redis", []string{"IDEM_REDIS_URL=redis://" + addr + "/0"}, []string{"inspect", "charge:k"}},
		{"redis cluster", []string{"IDEM_REDIS_CLUSTER=" + addr}, []string{"inspect", "charge:k"}},
		{"postgres", []string{"IDEM_PG_URL=postgres://idem@" + addr + "/idem"}, []string{"stats"}},
		{"mysql", []string{"IDEM_MYSQL_DSN=idem:secret@tcp(" + addr + ")/idem"}, []string{"stats"}},
		{"dynamodb", awsAt("http://" + addr), []string{"stats"}},
	}
}

// requireTimedOut runs idem with --timeout 1s and checks that it gave up
// in time and said so.
func requireTimedOut(t *testing.T, env []string, args ...string) {
	t.Helper()
	const timeout = time.Second
	start := time.Now()
	r := idem(t, append(noStore, env...), "", append(args, "--timeout", timeout.String())...)
	elapsed := time.Since(start)
	require.Equal(t, exitError, r.code, r.stdout+r.stderr)
	// Without the bound, the client libraries' own timeouts and retries
	// held the command 5 s and more; the margin is for a loaded machine.
	require.Less(t, elapsed, timeout+3*time.Second, "--timeout bounds the command: %s", r.stderr)
	requireOneLine(t, r.stderr)
	require.Contains(t, r.stderr, "did not answer within 1s (--timeout)")
	require.NotContains(t, r.stderr, "answered with an error")
}

// --timeout bounds the whole command against a server that takes the
// connection and never answers, whatever the client library's own
// timeouts (go-redis reads for 3 s, and retries).
func TestTimeoutAgainstAHungServer(t *testing.T) {
	for _, c := range storesAt(hungServer(t)) {
		t.Run(c.name, func(t *testing.T) { requireTimedOut(t, c.env, c.args...) })
	}
}

// --timeout bounds the store's calls after it was reached too: a table
// locked by another session holds idem's query.
func TestTimeoutAgainstALockedTable(t *testing.T) {
	ctx := context.Background()
	t.Run("postgres", func(t *testing.T) {
		schema := strings.NewReplacer("-", "_", ":", "").Replace(unique("idem_locked_"))
		env := []string{"IDEM_PG_URL=" + service(t, "TEST_DATABASE_URL"), "IDEM_PG_SCHEMA=" + schema}
		pool, err := pgxpool.New(ctx, service(t, "TEST_DATABASE_URL"))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
		require.Contains(t, ok(t, append(noStore, env...), "pg", "migrate"), "is ready")
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		_, err = tx.Exec(ctx, `LOCK TABLE `+schema+`.idempotency_keys IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		requireTimedOut(t, env, "stats")
	})
	t.Run("mysql", func(t *testing.T) {
		table, db := mysqlTable(t)
		env := []string{"IDEM_MYSQL_DSN=" + mysqlDSN(t), "IDEM_MYSQL_TABLE=" + table}
		require.Contains(t, ok(t, append(noStore, env...), "mysql", "migrate"), "is ready")
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		_, err = conn.ExecContext(ctx, "LOCK TABLES `"+table+"` WRITE")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = conn.ExecContext(context.Background(), "UNLOCK TABLES") })
		requireTimedOut(t, env, "stats")
	})
}

// A server that cannot be reached does not answer; the client libraries'
// own log lines (go-redis prints one per attempt) do not show.
func TestStoreDoesNotAnswer(t *testing.T) {
	addr := closedPort(t)
	for _, c := range storesAt(addr) {
		t.Run(c.name, func(t *testing.T) {
			r := idem(t, append(noStore, c.env...), "", c.args...)
			require.Equal(t, exitError, r.code, r.stdout+r.stderr)
			requireOneLine(t, r.stderr)
			require.Contains(t, r.stderr, " does not answer: dial tcp "+addr)
			require.NotContains(t, r.stderr, "answered")
		})
	}
}

// A server that answers with an error answered: idem quotes the error.
func TestStoreAnsweredWithError(t *testing.T) {
	ctx := context.Background()

	// A Redis key of another type where a record should be.
	prefix := unique("idem-wrongtype-")
	client := redis.NewClient(&redis.Options{Addr: service(t, "REDIS_ADDR")})
	t.Cleanup(func() { client.Close() })
	require.NoError(t, client.RPush(ctx, prefix+"charge:k", "not a record").Err())
	t.Cleanup(func() { client.Del(context.Background(), prefix+"charge:k") })

	// A Postgres and a MySQL table of the right name and the wrong columns.
	schema := strings.NewReplacer("-", "_", ":", "").Replace(unique("idem_wrong_"))
	pool, err := pgxpool.New(ctx, service(t, "TEST_DATABASE_URL"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
	_, err = pool.Exec(ctx, `CREATE SCHEMA `+schema+`; CREATE TABLE `+schema+`.idempotency_keys (x int)`)
	require.NoError(t, err)
	table, db := mysqlTable(t)
	_, err = db.ExecContext(ctx, "CREATE TABLE `"+table+"` (x int)")
	require.NoError(t, err)
	// A DynamoDB table of the right name and the wrong key.
	dynamo := dynamoEnv(t)
	dynamoTable := strings.TrimPrefix(dynamo[2], "IDEM_DYNAMO_TABLE=")
	_, err = dynamoClient(t).CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(dynamoTable),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("other"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("other"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	require.NoError(t, err)

	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"redis WRONGTYPE", []string{"IDEM_REDIS_URL=redis://" + service(t, "REDIS_ADDR") + "/0", "IDEM_REDIS_PREFIX=" + prefix},
			[]string{"inspect", "charge:k"}, "WRONGTYPE"},
		{"postgres", []string{"IDEM_PG_URL=" + service(t, "TEST_DATABASE_URL"), "IDEM_PG_SCHEMA=" + schema},
			[]string{"stats"}, `does not exist (SQLSTATE 42703)"`},
		{"mysql", []string{"IDEM_MYSQL_DSN=" + mysqlDSN(t), "IDEM_MYSQL_TABLE=" + table},
			[]string{"stats"}, `"Error 1054 (42S22): Unknown column`},
		{"dynamodb", dynamo, []string{"inspect", "charge:k"}, `"ValidationException: `},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := idem(t, append(noStore, c.env...), "", c.args...)
			require.Equal(t, exitError, r.code, r.stdout+r.stderr)
			requireOneLine(t, r.stderr)
			require.Contains(t, r.stderr, ` answered with an error: "`)
			require.Contains(t, r.stderr, c.want)
			require.NotContains(t, r.stderr, "not answer")
		})
	}
}
