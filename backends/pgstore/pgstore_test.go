package pgstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/storetest"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A pool, a connection and a transaction all fit the store.
var (
	_ pgstore.DB = (*pgxpool.Pool)(nil)
	_ pgstore.DB = (*pgx.Conn)(nil)
	_ pgstore.DB = (pgx.Tx)(nil)
)

var schemaSeq atomic.Int64

// newStore returns a migrated store in a schema of its own, dropped when
// the test ends, and closed before that.
func newStore(t *testing.T, pool *pgxpool.Pool, opts pgstore.Options) *pgstore.Store {
	t.Helper()
	opts.Schema = fmt.Sprintf("pgstore_test_%d_%d", time.Now().UnixNano()%1e9, schemaSeq.Add(1))
	s, err := pgstore.New(pool, opts)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DROP SCHEMA `+opts.Schema+` CASCADE`)
		require.NoError(t, err)
	})
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

func TestConformance(t *testing.T) {
	pool := testserver.PostgresPool(t)
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		return storetest.Fixture{Store: newStore(t, pool, pgstore.Options{})}
	})
}

func TestConformanceUnlogged(t *testing.T) {
	pool := testserver.PostgresPool(t)
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		return storetest.Fixture{Store: newStore(t, pool, pgstore.Options{Unlogged: true})}
	})
}
