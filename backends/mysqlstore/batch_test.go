package mysqlstore_test

import (
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
)

// Acquire calls that queue behind one in flight go to MariaDB as one
// statement, and each gets the answer it would get alone: a new key its
// lease, a completed key its output, another's live lease the time it has
// left; a record the insert cannot settle (a released key) goes on to
// the upsert, and a key that comes twice in the batch runs again after
// it, seeing the first call's lease.
func TestAcquireCallsQueuedGoInOneStatement(t *testing.T) {
	t.Parallel()
	db := openDB(t, 1, nil) // one connection: every statement of the store's is counted on it
	s := newStore(t, db, mysqlstore.Options{Flavor: mysqlstore.FlavorMariaDB, InFlight: 1})
	acq := func(key, owner string) (backends.AcquireResult, error) {
		return s.Acquire(ctx(t), backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: time.Minute, Retention: time.Hour})
	}
	done := acquire(t, s, "done", "a", time.Minute)
	require.NoError(t, s.Complete(ctx(t), done.Lease, []byte("out")))
	acquire(t, s, "held", "a", time.Minute)
	released := acquire(t, s, "released", "a", time.Minute)
	require.NoError(t, s.Release(ctx(t), released.Lease))
	acquire(t, s, "blocker", "a", time.Minute)
	before := executed(t, db)
	var wg sync.WaitGroup
	release := blockOn(t, s, "blocker", "INSERT", func() {
		res, err := acq("blocker", "b")
		if assert.NoError(t, err) {
			assert.Equal(t, backends.StatusInProgress, res.Status)
		}
	}, &wg)

	calls := []struct{ key, owner string }{
		{"new-1", "b"}, {"new-2", "b"}, {"done", "b"}, {"held", "b"}, {"released", "b"},
		{"twice", "b"}, {"twice", "c"}, {"mine", "b"}, {"mine", "b"},
	}
	results := make([]backends.AcquireResult, len(calls))
	for i, c := range calls {
		wg.Go(func() {
			var err error
			results[i], err = acq(c.key, c.owner)
			assert.NoError(t, err, "%s by %s", c.key, c.owner)
		})
	}
	require.Eventually(t, func() bool { return mysqlstore.QueuedAcquires(s) == len(calls) }, time.Minute, time.Millisecond)
	release()
	wg.Wait()

	byKey := map[string][]backends.AcquireResult{}
	for i, c := range calls {
		byKey[c.key] = append(byKey[c.key], results[i])
	}
	for _, key := range []string{"new-1", "new-2"} {
		res := byKey[key][0]
		assert.Equal(t, backends.StatusAcquired, res.Status, key)
		assert.Equal(t, backends.Lease{Key: key, Owner: "b", Token: 1, Attempt: 1}, res.Lease, key)
		assert.False(t, res.Reentrant, key)
	}
	assert.Equal(t, backends.StatusCompleted, byKey["done"][0].Status)
	assert.Equal(t, []byte("out"), byKey["done"][0].Output)
	assert.Equal(t, backends.StatusInProgress, byKey["held"][0].Status)
	assert.Positive(t, byKey["held"][0].Remaining)
	assert.Equal(t, backends.StatusAcquired, byKey["released"][0].Status)
	assert.Equal(t, int64(2), byKey["released"][0].Lease.Token)
	// "twice": one of the two owners holds it, the other is told so.
	statuses := []backends.Status{byKey["twice"][0].Status, byKey["twice"][1].Status}
	assert.ElementsMatch(t, []backends.Status{backends.StatusAcquired, backends.StatusInProgress}, statuses)
	// "mine": the same owner twice holds the same lease, the second
	// re-entrant.
	mine := byKey["mine"]
	assert.Equal(t, backends.StatusAcquired, mine[0].Status)
	assert.Equal(t, backends.StatusAcquired, mine[1].Status)
	assert.Equal(t, mine[0].Lease, mine[1].Lease)
	assert.True(t, mine[0].Reentrant != mine[1].Reentrant, "one of the two is re-entrant")

	// The blocker's statement; the batch's, for the seven distinct keys;
	// the insert again of the second call of each key that came twice;
	// and the upserts of the released key and of "mine" again: 6 in all,
	// where each call alone would have sent 12.
	assert.Equal(t, int64(6), executed(t, db)-before, "statements sent")
}

// The default InFlight is a quarter of the db's open-connection limit, at
// most GOMAXPROCS, at least one; GOMAXPROCS for a db without a limit. A
// negative one is refused.
func TestInFlight(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ maxOpen, procs, want int }{
		{0, 2, 2}, {0, 8, 8}, {1, 2, 1}, {8, 2, 2}, {8, 8, 2}, {32, 2, 2}, {32, 16, 8},
	} {
		assert.Equal(t, c.want, mysqlstore.DefaultInFlight(c.maxOpen, c.procs), "%+v", c)
	}
	_, err := mysqlstore.New(openDB(t, 1, nil), mysqlstore.Options{InFlight: -1})
	require.ErrorIs(t, err, backends.ErrInvalidOptions)
	s, err := mysqlstore.New(openDB(t, 1, nil), mysqlstore.Options{})
	require.NoError(t, err)
	assert.Zero(t, s.Options().InFlight, "the default stays 0 in Options")
}

// The statement for one call is "acquire first" itself, and the one for
// n calls the same with n rows of values.
func TestFirstStatementForMany(t *testing.T) {
	t.Parallel()
	s, err := mysqlstore.New(openDB(t, 1, nil), mysqlstore.Options{})
	require.NoError(t, err)
	one, together := mysqlstore.FirstStatements(s, 1)
	assert.Equal(t, one, together)
	_, together = mysqlstore.FirstStatements(s, 3)
	assert.Equal(t, 3*strings.Count(one, "?"), strings.Count(together, "?"))
	assert.Equal(t, strings.Count(one, "RETURNING"), strings.Count(together, "RETURNING"))
}

// executed is how many prepared statements db's session has run: db has
// one connection.
func executed(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var name string
	var n int64
	require.NoError(t, db.QueryRowContext(ctx(t), "SHOW SESSION STATUS LIKE 'Com_stmt_execute'").Scan(&name, &n))
	return n
}

// blockOn locks key's record from another connection and runs call, on
// wg, which sends a statement of s's (verb: INSERT or UPDATE) on that
// record; it returns once the statement waits for the lock, with a
// function that lets it go on. Meanwhile the store's one statement in
// flight (InFlight 1) is that one, and its calls after it queue.
func blockOn(t *testing.T, s *mysqlstore.Store, key, verb string, call func(), wg *sync.WaitGroup) (release func()) {
	t.Helper()
	tx, err := openDB(t, 1, nil).BeginTx(ctx(t), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	table := "`" + s.Options().Table + "`"
	_, err = tx.ExecContext(ctx(t), "SELECT 1 FROM "+table+" WHERE `key` = ? FOR UPDATE", []byte(key))
	require.NoError(t, err)
	wg.Go(call)
	prefix := map[string]string{"INSERT": "INSERT INTO ", "UPDATE": "UPDATE "}[verb] + table + "%"
	require.Eventually(t, func() bool {
		var n int
		return tx.QueryRowContext(ctx(t), "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND = 'Execute' AND INFO LIKE ?",
			prefix).Scan(&n) == nil && n > 0
	}, time.Minute, 5*time.Millisecond, "the %s of %q does not wait for its record", verb, key)
	return func() { require.NoError(t, tx.Commit()) }
}

// Completions that queue behind one in flight go to MariaDB as one
// statement, each with its own output; one whose lease is lost is told
// so, and the others complete; a key completed twice in one batch (a
// lease lost and the one that took it) runs again after it.
func TestCompleteCallsQueuedGoInOneStatement(t *testing.T) {
	t.Parallel()
	db := openDB(t, 1, nil)
	s := newStore(t, db, mysqlstore.Options{Flavor: mysqlstore.FlavorMariaDB, InFlight: 1})
	leases := map[string]backends.Lease{}
	for _, key := range []string{"blocker-1", "blocker-2", "k1", "k2", "k3", "k4", "k5", "lost", "twice"} {
		leases[key] = acquire(t, s, key, "a", time.Minute).Lease
	}
	// "twice": its lease ran out and another took it; the old one
	// completes too.
	stale := leases["twice"]
	_, err := db.ExecContext(ctx(t), "UPDATE `"+s.Options().Table+"` SET lease_expires_us = lease_expires_us - 120000000 WHERE `key` = 'twice'")
	require.NoError(t, err)
	leases["twice"] = acquire(t, s, "twice", "b", time.Minute).Lease
	require.Equal(t, stale.Token+1, leases["twice"].Token)
	lost := leases["lost"]
	lost.Token++ // a lease "lost" never had

	complete := func(l backends.Lease) error { return s.Complete(ctx(t), l, []byte("out of "+l.Owner)) }
	run := func(blocker string, calls ...backends.Lease) []error {
		var wg sync.WaitGroup
		release := blockOn(t, s, blocker, "UPDATE", func() { assert.NoError(t, complete(leases[blocker])) }, &wg)
		errs := make([]error, len(calls))
		for i, l := range calls {
			wg.Go(func() { errs[i] = complete(l) })
		}
		require.Eventually(t, func() bool { return mysqlstore.QueuedCompletes(s) == len(calls) }, time.Minute, time.Millisecond)
		release()
		wg.Wait()
		return errs
	}
	completed := func(key, owner string) {
		t.Helper()
		rec, err := s.Inspect(ctx(t), key)
		require.NoError(t, err)
		assert.Equal(t, backends.StateCompleted, rec.State, key)
		assert.Equal(t, []byte("out of "+owner), rec.Output, key)
	}

	before := executed(t, db)
	errs := run("blocker-1", leases["k1"], leases["k2"], leases["k3"])
	assert.Equal(t, []error{nil, nil, nil}, errs)
	// The blocker's statement and the batch's, where each alone sends 4.
	assert.Equal(t, int64(2), executed(t, db)-before, "statements sent")
	for _, key := range []string{"k1", "k2", "k3"} {
		completed(key, "a")
	}

	errs = run("blocker-2", leases["k4"], lost, stale, leases["k5"], leases["twice"])
	require.Len(t, errs, 5)
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], backends.ErrLeaseLost, "a lease the record never had")
	assert.ErrorIs(t, errs[2], backends.ErrLeaseLost, "a lease another took")
	assert.NoError(t, errs[3])
	assert.NoError(t, errs[4], "the lease that took the key, after the stale one in the same batch")
	completed("k4", "a")
	completed("k5", "a")
	completed("twice", "b")
	rec, err := s.Inspect(ctx(t), "lost")
	require.NoError(t, err)
	assert.Equal(t, backends.StateInProgress, rec.State)
}
