package httpidem_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

// storeCase is a store the rules are checked against.
type storeCase struct {
	name string
	open func(t *testing.T) backends.Store
}

// stores are memstore, the shared Redis ($REDIS_ADDR) under a key prefix
// of the test's own, and the shared Postgres ($TEST_DATABASE_URL) in a
// schema of the test's own. A missing server fails the test.
var stores = []storeCase{
	{"memstore", func(t *testing.T) backends.Store {
		s, err := memstore.New(memstore.Options{})
		require.NoError(t, err)
		return s
	}},
	{"redis", func(t *testing.T) backends.Store {
		s, err := redisstore.New(testserver.RedisClient(t), redisstore.Options{Prefix: testserver.Unique("httpidem-test:")})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}},
	{"postgres", func(t *testing.T) backends.Store {
		s, _ := newPgStore(t)
		return s
	}},
}

var schemaSeq atomic.Int64

// newPgStore returns a pgstore in a schema of its own, dropped when the
// test ends, and its pool.
func newPgStore(t *testing.T) (*pgstore.Store, *pgxpool.Pool) {
	t.Helper()
	pool := testserver.PostgresPool(t)
	schema := fmt.Sprintf("httpidem_test_%d_%d", time.Now().UnixNano()%1e9, schemaSeq.Add(1))
	s, err := pgstore.New(pool, pgstore.Options{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(t.Context()))
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
		require.NoError(t, err)
	})
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s, pool
}

// eachStore runs test once against each store, as a subtest named after
// it.
func eachStore(t *testing.T, test func(t *testing.T, s storeCase)) {
	t.Helper()
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			test(t, s)
		})
	}
}
