package pgstore_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

// batches is a pgx tracer that keeps the size of every batch sent.
type batches struct {
	mu    sync.Mutex
	sizes []int
}

func (b *batches) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (b *batches) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (b *batches) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sizes = append(b.sizes, data.Batch.Len())
	return ctx
}
func (b *batches) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (b *batches) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// Calls that queue while another is in flight go out together, as one
// batch; a statement Postgres refuses rolls the batch back, and every
// call of it is then sent again alone: the refusal is that call's error,
// never another's.
func TestBatchRefusedCallIsNotAnothersError(t *testing.T) {
	ctx := context.Background()
	traced := &batches{}
	pool := tracedPool(t, 4, traced) // one batch in flight at a time
	store := newStore(t, pool, pgstore.Options{Wake: pgstore.WakePoll})
	table := `"` + store.Options().Schema + `"."` + store.Options().Table + `"`
	_, err := pool.Exec(ctx, `ALTER TABLE `+table+` ADD CONSTRAINT refused CHECK (owner <> 'refused')`)
	require.NoError(t, err)
	tx, first := holdInFlight(t, pool, store)
	defer tx.Rollback(ctx) //nolint:errcheck

	const queued = 6
	type result struct {
		owner string
		res   backends.AcquireResult
		err   error
	}
	results := make(chan result, queued)
	for i := range queued {
		owner := fmt.Sprintf("owner-%d", i)
		if i == queued/2 {
			owner = "refused"
		}
		go func() {
			res, err := acquireFor(store, "key-"+owner, owner)
			results <- result{owner, res, err}
		}()
	}
	require.Eventually(t, func() bool { return pgstore.Queued(store) == queued }, 10*time.Second, time.Millisecond)
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-first)

	for range queued {
		r := <-results
		if r.owner == "refused" {
			require.ErrorContains(t, r.err, "refused", "the refused call's own error")
			continue
		}
		require.NoError(t, r.err, r.owner)
		require.Equal(t, backends.StatusAcquired, r.res.Status, r.owner)
		rec, err := store.Inspect(ctx, "key-"+r.owner)
		require.NoError(t, err)
		require.Equal(t, r.owner, rec.Owner)
	}
	traced.mu.Lock()
	defer traced.mu.Unlock()
	require.Equal(t, []int{queued}, traced.sizes, "the queued calls went as one batch")
}

// tracedPool is a pool of maxConns connections that traces its batches
// into traced.
func tracedPool(t *testing.T, maxConns int32, traced *batches) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.Tracer = traced
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// acquireFor acquires key for owner, within a minute.
func acquireFor(store *pgstore.Store, key, owner string) (backends.AcquireResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: time.Minute, Retention: time.Hour})
}

// holdInFlight keeps one of store's calls in flight: another transaction,
// tx, inserts the key "held" and keeps it uncommitted, and an Acquire of
// it waits for tx to end; first receives that Acquire's error then.
func holdInFlight(t *testing.T, pool *pgxpool.Pool, store *pgstore.Store) (tx pgx.Tx, first <-chan error) {
	t.Helper()
	ctx := context.Background()
	table := pgx.Identifier{store.Options().Schema, store.Options().Table}.Sanitize()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+table+` (key, state, owner, token, attempt, lease_expires_at, retention_us, forget_at)
		VALUES ('held', $1, 'x', 1, 1, now(), 0, now() + interval '1 hour')`, pgstore.StateReleased)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := acquireFor(store, "held", "first")
		done <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%')`,
			pgstore.AcquireFunction(store)).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, "the first Acquire waits for the row")
	return tx, done
}

// Options.InFlight bounds the round trips out at once: with one, the
// calls that arrive while one waits on a locked row queue, and go as one
// batch when it comes back. By default a pool of 16 has four out in a
// process of eight Ps, and the same calls go at once, each alone; in a
// process of one P, one, and they queue. The store reads GOMAXPROCS when
// it is made.
func TestInFlight(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inFlight int
		procs    int
		queue    bool
	}{
		{"one", 1, 8, true},
		{"default, a quarter of the pool", 0, 8, false},
		{"default, at most GOMAXPROCS", 0, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			traced := &batches{}
			pool := tracedPool(t, 16, traced)
			procs := runtime.GOMAXPROCS(tc.procs)
			store := newStore(t, pool, pgstore.Options{Wake: pgstore.WakePoll, InFlight: tc.inFlight})
			runtime.GOMAXPROCS(procs)
			tx, first := holdInFlight(t, pool, store)
			defer tx.Rollback(ctx) //nolint:errcheck

			const others = 3
			results := make(chan error, others)
			for i := range others {
				go func() {
					res, err := acquireFor(store, fmt.Sprintf("key-%d", i), "other")
					if err == nil && res.Status != backends.StatusAcquired {
						err = fmt.Errorf("key-%d: status %v", i, res.Status)
					}
					results <- err
				}()
			}
			if tc.queue {
				require.Eventually(t, func() bool { return pgstore.Queued(store) == others }, 10*time.Second, time.Millisecond)
			} else {
				for range others {
					require.NoError(t, <-results, "sent at once, while the held row's Acquire waits")
				}
				require.Zero(t, pgstore.Queued(store))
			}
			require.NoError(t, tx.Rollback(ctx))
			require.NoError(t, <-first)
			if tc.queue {
				for range others {
					require.NoError(t, <-results)
				}
			}
			traced.mu.Lock()
			defer traced.mu.Unlock()
			if tc.queue {
				require.Equal(t, []int{others}, traced.sizes, "the queued calls went as one batch")
			} else {
				require.Empty(t, traced.sizes, "no call queued, so none went in a batch")
			}
		})
	}
}
