package pgstore_test

import (
	"context"
	"crypto/md5" //nolint:gosec // the store's notification payload
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// wakeWait bounds a wait for a wake that must come: far above any round
// trip on a loaded machine, so that only a missing notification fails it.
// quiet is how long a test waits to see that nothing comes.
const (
	wakeWait = 30 * time.Second
	quiet    = 500 * time.Millisecond
)

func requireWoken(t *testing.T, changed <-chan struct{}, msgAndArgs ...any) {
	t.Helper()
	select {
	case <-changed:
	case <-time.After(wakeWait):
		require.Fail(t, "the watch was not woken within "+wakeWait.String(), msgAndArgs...)
	}
}

func requireNotWoken(t *testing.T, changed <-chan struct{}, msgAndArgs ...any) {
	t.Helper()
	select {
	case <-changed:
		require.Fail(t, "the watch was woken", msgAndArgs...)
	case <-time.After(quiet):
	}
}

func mustWatch(t *testing.T, s *pgstore.Store, key string) <-chan struct{} {
	t.Helper()
	changed, stop, ok := s.Watch(context.Background(), key)
	require.True(t, ok, "a store on a healthy pool watches")
	t.Cleanup(stop)
	return changed
}

// heldAndWatched returns a store on the test database, the lease of
// "holder" on key "k", and a watch on the key.
func heldAndWatched(t *testing.T) (*pgxpool.Pool, *pgstore.Store, backends.Lease, <-chan struct{}) {
	t.Helper()
	pool := testserver.PostgresPool(t)
	s := newStore(t, pool, pgstore.Options{})
	lease := acquire(t, s, "k", "holder").Lease
	return pool, s, lease, mustWatch(t, s, "k")
}

// listen returns a connection of its own that listens on the store's
// channel.
func listen(t *testing.T, s *pgstore.Store) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), testserver.PostgresURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(context.Background(), `LISTEN `+pgx.Identifier{pgstore.Channel(s)}.Sanitize())
	require.NoError(t, err)
	return conn
}

func table(s *pgstore.Store) string {
	return pgx.Identifier{s.Options().Schema, s.Options().Table}.Sanitize()
}

func waited(t *testing.T, pool *pgxpool.Pool, s *pgstore.Store, key string) bool {
	t.Helper()
	var w bool
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT waited FROM `+table(s)+` WHERE key = $1`, []byte(key)).Scan(&w))
	return w
}

// A completion in the handler's transaction wakes the watch when the
// transaction commits, and not if it rolls back; the mark survives the
// rollback, so the release that follows wakes it.
func TestWatchWokenByCompleteTxCommitOnly(t *testing.T) {
	pool, s, lease, changed := heldAndWatched(t)
	ctx := context.Background()
	requireNotWoken(t, changed, "nothing changed yet")
	require.True(t, waited(t, pool, s, "k"), "the watch marked the row")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, s.CompleteTx(ctx, tx, lease, nil))
	requireNotWoken(t, changed, "the completion is not committed")
	require.NoError(t, tx.Rollback(ctx))
	requireNotWoken(t, changed, "the completion rolled back")
	require.True(t, waited(t, pool, s, "k"), "the mark rolled back with the completion")

	require.NoError(t, s.Release(ctx, lease))
	requireWoken(t, changed, "the release wakes it")
	require.False(t, waited(t, pool, s, "k"), "the release cleared the mark as it notified")

	retry := acquire(t, s, "k", "retry").Lease
	changed = mustWatch(t, s, "k")
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	require.NoError(t, s.CompleteTx(ctx, tx, retry, nil))
	requireNotWoken(t, changed, "the completion is not committed")
	require.NoError(t, tx.Commit(ctx))
	requireWoken(t, changed, "the commit wakes it")
}

// listenerPID is the backend of the store's listener, once it listens on
// a backend other than those in old.
func listenerPID(t *testing.T, pool *pgxpool.Pool, s *pgstore.Store, old ...int) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		listen := `LISTEN ` + pgx.Identifier{pgstore.Channel(s)}.Sanitize()
		return pool.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity WHERE query IN ($1, $2) AND pid <> ALL($3::int[])`,
			listen, "-- "+listen, append([]int{}, old...)).Scan(&pid) == nil
	}, wakeWait, 10*time.Millisecond, "the listener's backend")
	return pid
}

// The listener's backend is terminated while a duplicate waits: its watch
// is woken (a notification may have been missed), Watch reports not ok at
// once until the listener listens again on a new connection, and a watch
// from then on is woken by a completion again.
func TestWatchListenerTerminated(t *testing.T) {
	pool, s, lease, changed := heldAndWatched(t)
	ctx := context.Background()
	pid := listenerPID(t, pool, s)

	_, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	requireWoken(t, changed, "losing the listener wakes its watches")

	var notOK int
	deadline := time.Now().Add(wakeWait)
	for {
		start := time.Now()
		changed, stop, ok := s.Watch(ctx, "k")
		if ok {
			t.Cleanup(stop)
			requireNotWoken(t, changed, "the new watch is in place")
			require.NoError(t, s.Complete(ctx, lease, nil))
			requireWoken(t, changed, "a completion wakes it after the reconnect")
			break
		}
		notOK++
		require.Nil(t, changed)
		stop()
		require.Less(t, time.Since(start), 5*time.Second, "Watch reports not ok at once while the listener is down")
		require.True(t, time.Now().Before(deadline), "the listener did not listen again within %v", wakeWait)
		time.Sleep(10 * time.Millisecond)
	}
	require.NotEqual(t, pid, listenerPID(t, pool, s), "on a new connection")
	t.Logf("Watch reported not ok %d times before the listener listened again", notOK)
}

// A key nobody watches sends no notification when it is completed,
// released or deleted; a watched one sends exactly one, with the key's
// MD5 as payload, and clears its mark, so the next change sends none.
func TestNotifyOnlyForWatchedKeys(t *testing.T) {
	pool := testserver.PostgresPool(t)
	s := newStore(t, pool, pgstore.Options{})
	ctx := context.Background()
	conn := listen(t, s)
	requireSilent := func(msg string) {
		t.Helper()
		wait, cancel := context.WithTimeout(ctx, quiet)
		defer cancel()
		n, err := conn.WaitForNotification(wait)
		require.Error(t, err, "%s: got %+v", msg, n)
		require.NoError(t, ctx.Err())
	}

	// A duplicate that only looks, without watching, marks nothing.
	done := acquire(t, s, "done", "a").Lease
	require.Equal(t, backends.StatusInProgress, acquire(t, s, "done", "b").Status)
	require.NoError(t, s.Complete(ctx, done, nil))
	released := acquire(t, s, "released", "a").Lease
	require.NoError(t, s.Release(ctx, released))
	require.NoError(t, s.Delete(ctx, "done"))
	requireSilent("no watch, no notification")

	lease := acquire(t, s, "watched", "a").Lease
	changed := mustWatch(t, s, "watched")
	mustWatch(t, s, "watched") // a second watch of the key marks nothing more
	require.NoError(t, s.Complete(ctx, lease, nil))
	wait, cancel := context.WithTimeout(ctx, wakeWait)
	defer cancel()
	n, err := conn.WaitForNotification(wait)
	require.NoError(t, err)
	sum := md5.Sum([]byte("watched")) //nolint:gosec // the store's payload
	require.Equal(t, pgstore.Channel(s), n.Channel)
	require.Equal(t, hex.EncodeToString(sum[:]), n.Payload)
	requireWoken(t, changed)
	requireSilent("one notification per mark")
	require.NoError(t, s.Delete(ctx, "watched"))
	requireSilent("the completion cleared the mark")
}

// A watch that marks the row after a completion's statement began, but
// before the completion locked the row, is still notified: the statement
// reads the mark from the row as it locked it, not from its snapshot.
func TestNotifyReadsMarkCommittedWhileCompletionWaited(t *testing.T) {
	pool, s, lease, changed := heldAndWatched(t)
	ctx := context.Background()
	// Take the mark away, then put it back in a transaction that holds
	// the row's lock while the completion starts and waits for it.
	_, err := pool.Exec(ctx, `UPDATE `+table(s)+` SET waited = false WHERE key = $1`, []byte("k"))
	require.NoError(t, err)
	// The completion runs on a pool of one connection, whose backend the
	// test knows.
	one := smallPool(t, 1)
	onConn, err := pgstore.New(one, s.Options())
	require.NoError(t, err)
	t.Cleanup(func() { _ = onConn.Close() })
	pid := onlyBackend(t, one)
	marker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer marker.Rollback(ctx) //nolint:errcheck
	_, err = marker.Exec(ctx, `UPDATE `+table(s)+` SET waited = true WHERE key = $1`, []byte("k"))
	require.NoError(t, err)

	completed := make(chan error, 1)
	go func() { completed <- onConn.Complete(ctx, lease, nil) }()
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting)
		return err == nil && waiting
	}, wakeWait, 5*time.Millisecond, "the completion waits on the row lock")
	require.NoError(t, marker.Commit(ctx))
	require.NoError(t, <-completed)
	requireWoken(t, changed)
}

// Many watches of a few keys at once, placed concurrently, while the keys
// are completed, released and deleted concurrently and other goroutines
// start and stop watches of the same keys: every watch is woken, and none
// before its key changed.
func TestWatchManyWatchesConcurrently(t *testing.T) {
	const (
		keys     = 16
		watchers = 64
		churners = 8
		rounds   = 3
	)
	pool := testserver.PostgresPool(t)
	s := newStore(t, pool, pgstore.Options{})
	ctx := context.Background()
	for round := range rounds {
		leases := make([]backends.Lease, keys)
		for k := range leases {
			leases[k] = acquire(t, s, fmt.Sprintf("r%d-k%d", round, k), "holder").Lease
		}
		type watched struct {
			key     int
			changed <-chan struct{}
		}
		placed := make(chan watched, watchers)
		var wg sync.WaitGroup
		for i := range watchers {
			wg.Go(func() {
				changed, stop, ok := s.Watch(ctx, leases[i%keys].Key)
				if !ok {
					t.Errorf("round %d: watch %d not ok", round, i)
					return
				}
				t.Cleanup(stop)
				placed <- watched{i % keys, changed}
			})
		}
		wg.Wait()
		close(placed)
		var all []watched
		early := 0
		for w := range placed {
			select {
			case <-w.changed:
				early++
			default:
			}
			all = append(all, w)
		}
		require.Zero(t, early, "round %d: watches woken before any change", round)

		stopChurn := make(chan struct{})
		var churned sync.WaitGroup
		for c := range churners {
			churned.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stopChurn:
						return
					default:
					}
					_, stop, _ := s.Watch(ctx, leases[(c+i)%keys].Key)
					stop()
				}
			})
		}
		var changes sync.WaitGroup
		for k, l := range leases {
			changes.Go(func() {
				var err error
				switch k % 4 {
				case 0, 1:
					err = s.Complete(ctx, l, nil)
				case 2:
					err = s.Release(ctx, l)
				default:
					err = s.Delete(ctx, l.Key)
				}
				if err != nil {
					t.Errorf("round %d: change of key %d: %v", round, k, err)
				}
			})
		}
		changes.Wait()
		for _, w := range all {
			requireWoken(t, w.changed, "round %d: a watch of key %d", round, w.key)
		}
		close(stopChurn)
		churned.Wait()
	}
}

// Close wakes every watch and ends the listener; a later Watch reports
// not ok; Close again, or on a store that never watched, does nothing.
func TestCloseEndsWatches(t *testing.T) {
	pool := testserver.PostgresPool(t)
	s := newStore(t, pool, pgstore.Options{})
	acquire(t, s, "k", "holder")
	changed := mustWatch(t, s, "k")
	listenerPID(t, pool, s)
	require.NoError(t, s.Close())
	requireWoken(t, changed, "Close wakes the watches")
	_, stop, ok := s.Watch(context.Background(), "k")
	require.False(t, ok, "a closed store does not watch")
	stop()
	require.NoError(t, s.Close(), "Close is idempotent")
	require.Eventually(t, func() bool {
		var n int
		listen := `LISTEN ` + pgx.Identifier{pgstore.Channel(s)}.Sanitize()
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE query IN ($1, $2)`,
			listen, "-- "+listen).Scan(&n)
		return err == nil && n == 0
	}, wakeWait, 10*time.Millisecond, "the listener's connection is closed")

	never, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	require.NoError(t, never.Close())
}

// Watch reports not ok, at once, with WakePoll, and marks nothing.
func TestWatchNotOKWithWakePoll(t *testing.T) {
	pool := testserver.PostgresPool(t)
	base := newStore(t, pool, pgstore.Options{})
	acquire(t, base, "k", "holder")
	opts := base.Options()
	opts.Wake = pgstore.WakePoll
	s, err := pgstore.New(pool, opts)
	require.NoError(t, err)
	changed, stop, ok := s.Watch(context.Background(), "k")
	require.False(t, ok)
	require.Nil(t, changed)
	stop()
	require.NoError(t, s.Close())
	require.False(t, waited(t, pool, base, "k"), "a store that does not watch marks nothing")
}

// A watch of a key without a lease in progress is woken at once, and
// marks nothing: there is nothing to wait for, and its caller looks at
// the store again.
func TestWatchWithoutLeaseInProgressWokenAtOnce(t *testing.T) {
	pool := testserver.PostgresPool(t)
	s := newStore(t, pool, pgstore.Options{})
	ctx := context.Background()
	requireWoken(t, mustWatch(t, s, "absent"), "absent")

	done := acquire(t, s, "done", "a").Lease
	require.NoError(t, s.Complete(ctx, done, nil))
	released := acquire(t, s, "released", "a").Lease
	require.NoError(t, s.Release(ctx, released))
	res, err := s.Acquire(ctx, backends.AcquireRequest{Key: "expired", Owner: "a", LeaseTTL: time.Millisecond, Retention: time.Hour})
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, res.Status)
	time.Sleep(10 * time.Millisecond)
	for _, key := range []string{"done", "released", "expired"} {
		requireWoken(t, mustWatch(t, s, key), key)
		require.False(t, waited(t, pool, s, key), "%s: not marked", key)
	}
}

// Migrate adds the waited column to a table created before it, and a
// watch then works on it.
func TestMigrateAddsWaitedColumn(t *testing.T) {
	pool := testserver.PostgresPool(t)
	s := newStore(t, pool, pgstore.Options{})
	ctx := context.Background()
	_, err := pool.Exec(ctx, `ALTER TABLE `+table(s)+` DROP COLUMN waited`)
	require.NoError(t, err)
	lease := acquire(t, s, "k", "holder").Lease
	require.NoError(t, s.Migrate(ctx))
	require.NoError(t, s.Migrate(ctx), "and again")
	require.False(t, waited(t, pool, s, "k"), "existing rows are not marked")
	changed := mustWatch(t, s, "k")
	require.NoError(t, s.Complete(ctx, lease, nil))
	requireWoken(t, changed)
}

// A listener whose connection stays silent pings it and keeps it: after
// many pings the same connection still delivers notifications.
func TestWatchListenerPingsSilentConnection(t *testing.T) {
	t.Cleanup(pgstore.SetListenIdle(20 * time.Millisecond))
	pool, s, lease, changed := heldAndWatched(t)
	pid := listenerPID(t, pool, s)
	requireNotWoken(t, changed, "pings wake no watch")
	require.Eventually(t, func() bool {
		var query string
		err := pool.QueryRow(context.Background(), `SELECT query FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&query)
		return err == nil && query == "-- LISTEN "+pgx.Identifier{pgstore.Channel(s)}.Sanitize()
	}, wakeWait, 5*time.Millisecond, "the listener pinged its connection")
	require.NoError(t, s.Complete(context.Background(), lease, nil))
	requireWoken(t, changed, "the pinged connection still delivers")
}

// Cleanup deleting a record a watch marked (its lease ran out, then its
// retention) wakes the watch; deleting records nobody watched sends
// nothing.
func TestCleanupWakesWatchOfRecordItDeletes(t *testing.T) {
	pool := testserver.PostgresPool(t)
	s := newStore(t, pool, pgstore.Options{})
	ctx := context.Background()
	conn := listen(t, s)

	acquire(t, s, "watched", "a")
	acquire(t, s, "unwatched", "a")
	changed := mustWatch(t, s, "watched")
	require.True(t, waited(t, pool, s, "watched"))
	// Both leases run out, and then both retentions, without a change.
	_, err := pool.Exec(ctx, `UPDATE `+table(s)+` SET lease_expires_at = now() - interval '2 s', forget_at = now() - interval '1 s'`)
	require.NoError(t, err)
	requireNotWoken(t, changed, "an expiry sends nothing")
	n, err := s.Cleanup(ctx, 10)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	requireWoken(t, changed)

	wait, cancel := context.WithTimeout(ctx, wakeWait)
	defer cancel()
	got, err := conn.WaitForNotification(wait)
	require.NoError(t, err)
	sum := md5.Sum([]byte("watched")) //nolint:gosec // the store's payload
	require.Equal(t, hex.EncodeToString(sum[:]), got.Payload)
	wait, cancel = context.WithTimeout(ctx, quiet)
	defer cancel()
	_, err = conn.WaitForNotification(wait)
	require.Error(t, err, "one notification, for the watched record only")
}

// watchCounter counts the store's watches placed and refused.
type watchCounter struct {
	*pgstore.Store
	placed, refused atomic.Int64
}

func (w *watchCounter) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	changed, stop, ok := w.Store.Watch(ctx, key)
	if ok {
		w.placed.Add(1)
	} else {
		w.refused.Add(1)
	}
	return changed, stop, ok
}

// The listener's backend is terminated while a duplicate waits for its
// holder through the middleware, and the holder completes: the duplicate
// is acked as a duplicate after the completion and not before, without
// running the handler, within a bound far above the middleware's slowest
// look at the store. Completed at once, the completion's notification
// reaches no watch (the listener lost them all), and the duplicate finds
// it by asking the store. Completed once the listener is back, the
// duplicate has watched again and is woken.
func TestDuplicateAckedWhenListenerTerminatedMidWait(t *testing.T) {
	const maxPoll = 100 * time.Millisecond
	// The slowest look at the store is a watched wait's safety look,
	// every Timing.WatchedPoll (10 × Poll.Max) with 20% jitter; a polled
	// wait looks every Poll.Max at most.
	const bound = 10 * (10 * maxPoll * 6 / 5)
	for _, tc := range []struct {
		name       string
		relistened bool // complete once the listener listens again
	}{{"completed at once", false}, {"completed once the listener is back", true}} {
		t.Run(tc.name, func(t *testing.T) {
			pool := testserver.PostgresPool(t)
			store := &watchCounter{Store: newStore(t, pool, pgstore.Options{})}
			ctx := context.Background()
			var counters idempotency.Counters
			idem, err := idempotency.New(idempotency.Config{
				Store: store, Namespace: "w", LeaseTTL: 10 * time.Minute, Timing: idempotency.Timing{
					InProgressWait: 5 * time.Minute, Poll: idempotency.Backoff{Initial: 20 * time.Millisecond, Max: maxPoll},
				},
				Observer: &counters,
			})
			require.NoError(t, err)
			holder := acquire(t, store, "w:k", "holder").Lease
			var runs atomic.Int64
			done := make(chan error, 1)
			go func() {
				_, err := idem.Middleware(func(*message.Message) ([]*message.Message, error) {
					runs.Add(1)
					return nil, nil
				})(message.NewMessage("k", nil))
				done <- err
			}()
			require.Eventually(t, func() bool { return store.placed.Load() == 1 }, wakeWait, 5*time.Millisecond,
				"the waiting duplicate never watched its key")
			pid := listenerPID(t, pool, store.Store)
			_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
			require.NoError(t, err)
			if tc.relistened {
				listenerPID(t, pool, store.Store, pid)
				require.Eventually(t, func() bool { return store.placed.Load() >= 2 }, wakeWait, 5*time.Millisecond,
					"the duplicate watches again once the listener is back")
			}

			select {
			case err := <-done:
				t.Fatalf("the duplicate ended before the holder completed: %v", err)
			default:
			}
			require.NoError(t, store.Complete(ctx, holder, nil))
			completed := time.Now()
			select {
			case err := <-done:
				require.NoError(t, err, "the duplicate is acked")
			case <-time.After(bound):
				t.Fatalf("the duplicate was not acked within %v of the completion", bound)
			}
			require.EqualValues(t, 1, counters.Count(idempotency.OutcomeDuplicate))
			require.Zero(t, runs.Load(), "the duplicate ran the handler")
			t.Logf("acked %v after the completion; %d watches placed, %d refused",
				time.Since(completed).Round(time.Millisecond), store.placed.Load(), store.refused.Load())
		})
	}
}
