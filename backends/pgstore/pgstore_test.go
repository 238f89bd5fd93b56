package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/storetest"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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

// A duplicate's Acquire only reads: of a completed key, or of a live
// lease held by another owner, it leaves the row as it was (the same row
// version, xmin) and its transaction writes nothing, so it waits for no
// WAL flush and leaves no dead row. 32 duplicates at once, 20 times each.
func TestDuplicateAcquireWritesNothing(t *testing.T) {
	pool := testserver.PostgresPool(t)
	s := newStore(t, pool, pgstore.Options{})
	ctx := context.Background()
	done := acquire(t, s, "done", "holder").Lease
	require.NoError(t, s.Complete(ctx, done, []byte("out")))
	acquire(t, s, "held", "holder")
	version := func(key string) (xmin string) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT xmin::text FROM `+table(s)+` WHERE key = $1`, []byte(key)).Scan(&xmin))
		return xmin
	}
	before := map[string]string{"done": version("done"), "held": version("held")}

	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := range 20 {
				owner := fmt.Sprintf("dup-%d-%d", g, i)
				res, err := s.Acquire(ctx, backends.AcquireRequest{Key: "done", Owner: owner, LeaseTTL: time.Minute, Retention: time.Hour})
				assert.NoError(t, err)
				assert.Equal(t, backends.Completed, res.Status)
				assert.Equal(t, []byte("out"), res.Output)
				res, err = s.Acquire(ctx, backends.AcquireRequest{Key: "held", Owner: owner, LeaseTTL: time.Minute, Retention: time.Hour})
				assert.NoError(t, err)
				assert.Equal(t, backends.InProgress, res.Status)
				assert.Positive(t, res.Remaining)
			}
		})
	}
	wg.Wait()
	require.Equal(t, before["done"], version("done"), "a duplicate of a completed key wrote its row")
	require.Equal(t, before["held"], version("held"), "a duplicate of a held key wrote its row")

	// What a duplicate cannot only read still writes: a fingerprint for a
	// record without one is adopted.
	res, err := s.Acquire(ctx, backends.AcquireRequest{Key: "held", Owner: "dup", LeaseTTL: time.Minute, Retention: time.Hour, Fingerprint: []byte("fp")})
	require.NoError(t, err)
	require.Equal(t, backends.InProgress, res.Status)
	require.Equal(t, []byte("fp"), res.Fingerprint)
	require.NotEqual(t, before["held"], version("held"), "the fingerprint was adopted")
}

// Migrate at start-up on a current schema takes no lock on the table: it
// returns while another transaction holds the lock a write takes (ROW
// EXCLUSIVE), where ALTER TABLE or CREATE INDEX would queue behind it
// (and every later call behind them). Nor does it when only the acquire
// function is missing. The 30 s bound is only there to
// end the test if it waits.
func TestMigrateOnCurrentSchemaTakesNoLock(t *testing.T) {
	pool := testserver.PostgresPool(t)
	s := newStore(t, pool, pgstore.Options{})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `LOCK TABLE `+table(s)+` IN ROW EXCLUSIVE MODE`)
	require.NoError(t, err)

	bounded, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, s.Migrate(bounded), "Migrate waited for the table's lock")

	// A table migrated by an earlier release, which created no acquire
	// function, gets the function alone: creating it locks no table.
	_, err = pool.Exec(ctx, `DROP FUNCTION `+pgx.Identifier{s.Options().Schema, s.Options().Table + "_acquire"}.Sanitize())
	require.NoError(t, err)
	require.NoError(t, s.Migrate(bounded), "Migrate waited for the table's lock to create the acquire function")
	acquire(t, s, "after-upgrade", "holder")

	// A schema that is not current is still migrated, once the lock is
	// gone.
	require.NoError(t, tx.Rollback(ctx))
	_, err = pool.Exec(ctx, `DROP INDEX `+pgx.Identifier{s.Options().Schema, s.Options().Table + "_fa"}.Sanitize())
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`,
		pgx.Identifier{s.Options().Schema, s.Options().Table + "_fa"}.Sanitize()).Scan(&exists))
	require.True(t, exists, "the index is back")
}
