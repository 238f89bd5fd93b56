// Package testenv gives the examples' tests their servers: the private
// ones `make test` starts and names in environment variables. A variable
// that is not set fails the test; a test never falls back to a server on
// a default port, which may be one the user runs for something else.
package testenv

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Service returns the address of a server from the environment variable
// name (REDIS_ADDR, TEST_DATABASE_URL, MYSQL_DSN, AMQP_URL, NATS_URL,
// SQS_ENDPOINT, DYNAMODB_ENDPOINT), and fails the test if it is not set.
func Service(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set. Run the tests with `make test`, which starts private servers and sets it, "+
			"or set it to a server the tests may write to", name)
	}
	return v
}

// Unique returns a name unlikely to repeat, to keep tests apart. It holds
// this run's id ($IDEM_TEST_RUN), by which `make test` finds the run's
// keys on a Redis the user shares.
func Unique(prefix string) string {
	return fmt.Sprintf("%s%s-%d-%d:", prefix, os.Getenv("IDEM_TEST_RUN"), os.Getpid(), time.Now().UnixNano())
}

// RedisClient connects to the Redis at $REDIS_ADDR and fails the test if
// it does not answer.
func RedisClient(t testing.TB) *redis.Client {
	t.Helper()
	addr := Service(t, "REDIS_ADDR")
	c := redis.NewClient(&redis.Options{Addr: addr})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s (REDIS_ADDR) does not answer: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// PostgresPool connects to the database at $TEST_DATABASE_URL and fails
// the test if it does not answer.
func PostgresPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := Service(t, "TEST_DATABASE_URL")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		t.Fatalf("Postgres (TEST_DATABASE_URL) does not answer: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
