package pgstore_test

import (
	"context"
	"fmt"
	"strings"
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
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	"github.com/watermill-idempotency/idempotency/storetest"
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
				res, err := s.Acquire(ctx, backends.AcquireRequest{Key: "done", Owner: owner, LeaseTTL: time.Minute, Retention: time.Hour, Origin: owner})
				assert.NoError(t, err)
				assert.Equal(t, backends.StatusCompleted, res.Status)
				assert.Equal(t, []byte("out"), res.Output)
				res, err = s.Acquire(ctx, backends.AcquireRequest{Key: "held", Owner: owner, LeaseTTL: time.Minute, Retention: time.Hour, Origin: owner})
				assert.NoError(t, err)
				assert.Equal(t, backends.StatusInProgress, res.Status)
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
	require.Equal(t, backends.StatusInProgress, res.Status)
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
	_, err = pool.Exec(ctx, `DROP FUNCTION `+pgstore.AcquireFunction(s))
	require.NoError(t, err)
	require.NoError(t, s.Migrate(bounded), "Migrate waited for the table's lock to create the acquire function")
	acquire(t, s, "after-upgrade", "holder")

	// One that an earlier release created, with another body, gets this
	// version's, again without the table's lock.
	function := pgstore.AcquireFunction(s) + `(bytea,text,bigint,bigint,bytea,text)`
	body := func() (src string) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure($1)`, function).Scan(&src))
		return src
	}
	var def string
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_get_functiondef(to_regprocedure($1))`, function).Scan(&def))
	_, err = pool.Exec(ctx, strings.Replace(def, "BEGIN", "BEGIN\n    -- an earlier release", 1))
	require.NoError(t, err)
	require.NotEqual(t, pgstore.FunctionBody(s), body())
	require.NoError(t, s.Migrate(bounded), "Migrate waited for the table's lock to replace the acquire function")
	require.Equal(t, pgstore.FunctionBody(s), body(), "the function has this version's body")
	acquire(t, s, "after-replace", "holder")

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

// A completion within its lease changes no indexed column, so Postgres
// makes it a HOT update: no new entry in the primary key or the forget_at
// index. forget_at stays as Acquire set it, a bound past the completion
// plus the retention; a completion after the lease's end moves it to
// that time. Counted on the completions' own transaction
// (pg_stat_xact_user_tables), with CompleteTx.
func TestCompleteWithinLeaseIsHOT(t *testing.T) {
	pool := testserver.PostgresPool(t)
	s := newStore(t, pool, pgstore.Options{})
	ctx := context.Background()
	forgetAt := func(key string) (forget, bound time.Time) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT forget_at, coalesce(completed_at, now()) + retention_us * interval '1 microsecond' FROM `+table(s)+` WHERE key = $1`,
			[]byte(key)).Scan(&forget, &bound))
		return forget, bound
	}
	const n = 20
	leases := make([]backends.Lease, n)
	before := make([]time.Time, n)
	for i := range leases {
		leases[i] = acquire(t, s, fmt.Sprint("hot-", i), "holder").Lease
		before[i], _ = forgetAt(leases[i].Key)
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	for _, l := range leases {
		require.NoError(t, s.CompleteTx(ctx, tx, l, nil))
	}
	var updates, hot int
	require.NoError(t, tx.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relid = to_regclass($1)`,
		table(s)).Scan(&updates, &hot))
	require.Equal(t, n, updates)
	require.Equal(t, n, hot, "every completion a HOT update")
	require.NoError(t, tx.Commit(ctx))
	for i, l := range leases {
		forget, bound := forgetAt(l.Key)
		require.True(t, forget.Equal(before[i]), "forget_at as Acquire set it")
		require.False(t, forget.Before(bound), "forget_at is past the completion plus the retention")
		rec, err := s.Inspect(ctx, l.Key)
		require.NoError(t, err)
		require.Equal(t, backends.StateCompleted, rec.State)
		require.True(t, rec.ExpiresAt.Equal(bound), "Inspect tells the end of the retention, %v, not forget_at", bound)
	}

	// After the lease's end (the record not yet forgotten: its retention
	// is long), the completion moves forget_at to the completion plus the
	// retention.
	res, err := s.Acquire(ctx, backends.AcquireRequest{Key: "late", Owner: "holder", LeaseTTL: time.Millisecond, Retention: time.Hour})
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, s.Complete(ctx, res.Lease, nil))
	forget, bound := forgetAt("late")
	require.True(t, forget.Equal(bound), "forget_at %v, completion plus retention %v", forget, bound)
}
