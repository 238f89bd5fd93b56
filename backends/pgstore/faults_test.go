package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	"github.com/watermill-idempotency/idempotency/storetest"
)

func acquire(t *testing.T, s backends.Store, key, owner string) backends.AcquireResult {
	t.Helper()
	res, err := s.Acquire(context.Background(), backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: time.Minute, Retention: time.Hour,
		Origin: "message_uuid=" + owner + " handler=test"})
	require.NoError(t, err)
	return res
}

// The store's backend is terminated while its Acquire waits on a row lock
// held by another transaction: the call fails at once instead of hanging,
// writes nothing, and the next call on a healthy connection works.
func TestBackendTerminatedMidAcquire(t *testing.T) {
	pool := testserver.PostgresPool(t)
	ctx := context.Background()
	onPool := newStore(t, pool, pgstore.Options{})
	// The victim's store has a pool of one connection, whose backend the
	// test knows.
	one := smallPool(t, 1)
	onConn, err := pgstore.New(one, onPool.Options())
	require.NoError(t, err)
	pid := onlyBackend(t, one)
	first := acquire(t, onPool, "k", "first")
	require.NoError(t, onPool.Release(ctx, first.Lease))

	// Hold the row's lock in another transaction.
	locker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer locker.Rollback(ctx) //nolint:errcheck
	_, err = locker.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{onPool.Options().Schema, onPool.Options().Table}.Sanitize()+` WHERE key = $1 FOR UPDATE`, []byte("k"))
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := onConn.Acquire(ctx, backends.AcquireRequest{Key: "k", Owner: "victim", LeaseTTL: time.Minute, Retention: time.Hour})
		done <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond, "the acquire waits on the row lock")

	_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	select {
	case err := <-done:
		require.Error(t, err, "the terminated call fails")
	case <-time.After(10 * time.Second):
		t.Fatal("the acquire hung after its backend was terminated")
	}
	require.NoError(t, locker.Rollback(ctx))

	res := acquire(t, onPool, "k", "next")
	require.Equal(t, backends.StatusAcquired, res.Status, "the victim's acquire wrote nothing")
	require.Equal(t, 2, res.Lease.Attempt)
}

// A server restart (fast shutdown) keeps committed leases and completions;
// a crash (immediate shutdown) keeps them too in a logged table, and
// empties an UNLOGGED one, as docs/postgres.md says.
func TestServerRestartKeepsCommittedState(t *testing.T) {
	pg := testserver.StartPostgres(t)
	ctx := context.Background()
	setup := pg.Pool(t) // a private server, thrown away: no schema to drop
	logged, err := pgstore.New(setup, pgstore.Options{Schema: "restart"})
	require.NoError(t, err)
	require.NoError(t, logged.Migrate(ctx))
	unlogged, err := pgstore.New(setup, pgstore.Options{Schema: "restart", Table: "unlogged", Unlogged: true})
	require.NoError(t, err)
	require.NoError(t, unlogged.Migrate(ctx))

	done := acquire(t, logged, "done", "a")
	require.NoError(t, logged.Complete(ctx, done.Lease, []byte("out")))
	held := acquire(t, logged, "held", "b")
	u := acquire(t, unlogged, "done", "c")
	require.NoError(t, unlogged.Complete(ctx, u.Lease, nil))

	reopen := func() (*pgstore.Store, *pgstore.Store) {
		pool := pg.Pool(t)
		l, err := pgstore.New(pool, logged.Options())
		require.NoError(t, err)
		un, err := pgstore.New(pool, unlogged.Options())
		require.NoError(t, err)
		return l, un
	}

	pg.Restart()
	l, un := reopen()
	res := acquire(t, l, "done", "x")
	require.Equal(t, backends.StatusCompleted, res.Status, "the completion survived a restart")
	require.Equal(t, []byte("out"), res.Output)
	require.Equal(t, backends.StatusInProgress, acquire(t, l, "held", "x").Status, "the lease survived a restart")
	require.NoError(t, l.Renew(ctx, held.Lease, time.Minute), "and its holder can renew it")
	require.Equal(t, backends.StatusCompleted, acquire(t, un, "done", "x").Status, "a clean restart keeps an UNLOGGED table")

	pg.Crash()
	l, un = reopen()
	require.Equal(t, backends.StatusCompleted, acquire(t, l, "done", "y").Status, "the completion survived a crash")
	require.Equal(t, backends.StatusAcquired, acquire(t, un, "done", "y").Status, "a crash empties an UNLOGGED table")
}

// Migrate is idempotent and safe when several instances start at once.
func TestConcurrentMigrate(t *testing.T) {
	pool := testserver.PostgresPool(t)
	base := newStore(t, pool, pgstore.Options{}) // a schema dropped at the end
	opts := base.Options()
	opts.Table = "migrated_concurrently"
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			p, err := pgxpool.New(context.Background(), testserver.PostgresURL(t))
			if err != nil {
				errs <- err
				return
			}
			defer p.Close()
			s, err := pgstore.New(p, opts)
			if err == nil {
				err = s.Migrate(context.Background())
			}
			errs <- err
		}()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
	s, err := pgstore.New(pool, opts)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()), "and again")
	require.Equal(t, backends.StatusAcquired, acquire(t, s, "k", "o").Status)
}

func TestCleanup(t *testing.T) {
	pool := testserver.PostgresPool(t)
	s := newStore(t, pool, pgstore.Options{})
	storetest.CheckCleanup(t, s, func() (n int) {
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+
			pgx.Identifier{s.Options().Schema, s.Options().Table}.Sanitize()).Scan(&n))
		return n
	})
}

func TestNewValidates(t *testing.T) {
	_, err := pgstore.New(nil, pgstore.Options{})
	require.ErrorIs(t, err, backends.ErrNilClient)
	require.EqualError(t, err, "pgstore: backends: nil client")
	_, err = pgstore.New((*pgxpool.Pool)(nil), pgstore.Options{})
	require.ErrorIs(t, err, backends.ErrNilClient, "a typed nil pool")
	pool := testserver.PostgresPool(t)
	_, err = pgstore.New(pool, pgstore.Options{Table: string(make([]byte, 70))})
	require.ErrorIs(t, err, backends.ErrInvalidOptions)
	_, err = pgstore.New(pool, pgstore.Options{Wake: pgstore.WakePoll + 1})
	require.ErrorIs(t, err, backends.ErrInvalidOptions, "an unknown Wake")
	_, err = pgstore.New(pool, pgstore.Options{InFlight: -1})
	require.ErrorIs(t, err, backends.ErrInvalidOptions, "a negative InFlight")
	s, err := pgstore.New(pool, pgstore.Options{Schema: `we"ird`, Table: `ta ble`})
	require.NoError(t, err, "identifiers are quoted, any name works")
	require.Equal(t, `we"ird`, s.Options().Schema)

	// The longest table name leaves room for its index's and its acquire
	// function's names: Postgres would silently cut a longer one at 63
	// bytes.
	_, err = pgstore.New(pool, pgstore.Options{Table: strings.Repeat("t", 56)})
	require.ErrorIs(t, err, backends.ErrInvalidOptions)
	longest := newStore(t, pool, pgstore.Options{Table: strings.Repeat("t", 55)})
	var index, function string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND indexname LIKE '%_fa'`, longest.Options().Schema).Scan(&index))
	require.Equal(t, strings.Repeat("t", 55)+"_fa", index)
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT proname FROM pg_proc WHERE pronamespace = to_regnamespace($1) AND proname LIKE '%_acquire'`, pgx.Identifier{longest.Options().Schema}.Sanitize()).Scan(&function))
	require.Equal(t, strings.Repeat("t", 55)+"_acquire", function)
	acquire(t, longest, "k", "o")
}

// The store reports the pool's MaxConns, so the middleware can keep half
// of the pool for lease keeping.
func TestPoolSize(t *testing.T) {
	s, err := pgstore.New(smallPool(t, 6), pgstore.Options{})
	require.NoError(t, err)
	require.Equal(t, 6, s.PoolSize())
}

// onlyBackend returns the backend process of the only connection of a
// pool of one, opening it if needed.
func onlyBackend(t *testing.T, p *pgxpool.Pool) uint32 {
	t.Helper()
	var pid uint32
	require.NoError(t, p.AcquireFunc(context.Background(), func(c *pgxpool.Conn) error {
		pid = c.Conn().PgConn().PID()
		return nil
	}))
	require.EqualValues(t, 1, p.Stat().MaxConns(), "a pool of one")
	return pid
}
