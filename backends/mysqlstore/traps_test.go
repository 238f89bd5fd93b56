package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
)

// clocks gives stores on one table whose server clocks stand still, each
// at its own time: a session's timestamp variable fixes UTC_TIMESTAMP(6)
// for it, so expiry is tested to the microsecond and without sleeping.
type clocks struct {
	t    *testing.T
	opts mysqlstore.Options
	t0   time.Time
}

func newClocks(t *testing.T, flavor mysqlstore.Flavor) clocks {
	s := newStore(t, openDB(t, 2, nil), mysqlstore.Options{Flavor: flavor})
	return clocks{t: t, opts: s.Options(), t0: time.UnixMicro(time.Now().UnixMicro())}
}

// at returns the time d after t0 and a store whose clock stands there.
func (c clocks) at(d time.Duration) (time.Time, *mysqlstore.Store) {
	at, db := c.open(d)
	s, err := mysqlstore.New(db, c.opts)
	require.NoError(c.t, err)
	return at, s
}

// open returns the time d after t0 and a pool whose clock stands there.
func (c clocks) open(d time.Duration) (time.Time, *sql.DB) {
	at := c.t0.Add(d)
	return at, openDB(c.t, 2, map[string]string{"timestamp": fmt.Sprintf("%d.%06d", at.Unix(), at.Nanosecond()/1000)})
}

func acquireFP(t *testing.T, s *mysqlstore.Store, key, owner, fp string) backends.AcquireResult {
	t.Helper()
	res, err := s.Acquire(ctx(t), backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: time.Minute, Retention: time.Hour, Fingerprint: []byte(fp)})
	require.NoError(t, err)
	return res
}

func inspect(t *testing.T, s *mysqlstore.Store, key string) backends.Record {
	t.Helper()
	rec, err := s.Inspect(ctx(t), key)
	require.NoError(t, err)
	return rec
}

var flavors = []mysqlstore.Flavor{mysqlstore.FlavorMariaDB, mysqlstore.FlavorMySQL}

// eachFlavor runs test for each flavor, as parallel subtests of t.
func eachFlavor(t *testing.T, test func(t *testing.T, flavor mysqlstore.Flavor)) {
	t.Parallel()
	for _, flavor := range flavors {
		t.Run(flavor.String(), func(t *testing.T) {
			t.Parallel()
			test(t, flavor)
		})
	}
}

// Trap: the assignments of ON DUPLICATE KEY UPDATE run left to right, and
// each sees the new values of those before it. Acquire decides (`how`)
// first, from the old row, and every later assignment reads only `how`
// and its own column's old value. Were owner, state or the lease assigned
// before the decision, it would see the caller's own values: a takeover
// would pass for a re-entry, a completed record would be reopened, a
// counter would move twice or not at all.
func TestAcquireAssignmentsReadTheOldRow(t *testing.T) {
	eachFlavor(t, func(t *testing.T, flavor mysqlstore.Flavor) {
		c := newClocks(t, flavor)
		t0, early := c.at(0)
		late, after := c.at(10 * time.Minute) // past a minute's lease, within an hour's retention
		_, forgotten := c.at(3 * time.Hour)   // past the retention too

		// A takeover of an expired lease by another owner.
		first := acquireFP(t, early, "taken", "a", "fp-a")
		require.Equal(t, backends.Lease{Key: "taken", Owner: "a", Token: 1, Attempt: 1}, first.Lease)
		res := acquireFP(t, after, "taken", "b", "fp-b")
		require.Equal(t, backends.StatusAcquired, res.Status)
		require.Equal(t, backends.Lease{Key: "taken", Owner: "b", Token: 2, Attempt: 2, Takeover: true}, res.Lease)
		require.Equal(t, []byte("fp-a"), res.Fingerprint, "the first fingerprint stays")
		rec := inspect(t, after, "taken")
		require.Equal(t, backends.StateInProgress, rec.State)
		require.Equal(t, "b", rec.Owner)
		require.EqualValues(t, 2, rec.Token)
		require.Equal(t, 2, rec.Attempt)
		require.Equal(t, late.Add(time.Minute).UnixMicro(), rec.LeaseExpiresAt.UnixMicro())
		require.Equal(t, late.Add(time.Minute+time.Hour).UnixMicro(), rec.ExpiresAt.UnixMicro())
		require.Equal(t, []byte("fp-a"), rec.Fingerprint)
		// The old owner, by a clock still within the new lease, is
		// refused and changes nothing.
		res = acquireFP(t, early, "taken", "a", "fp-a")
		require.Equal(t, backends.StatusInProgress, res.Status)
		require.Equal(t, late.Add(time.Minute).Sub(t0), res.Remaining)
		require.Equal(t, rec, inspect(t, after, "taken"))

		// A completed record, asked for by its owner and by another
		// after the lease would have expired: answered, not changed.
		l := acquireFP(t, early, "done", "a", "fp-a").Lease
		require.NoError(t, early.Complete(ctx(t), l, []byte("out")))
		rec = inspect(t, after, "done")
		require.Equal(t, backends.StateCompleted, rec.State)
		for _, owner := range []string{"a", "b"} {
			res := acquireFP(t, after, "done", owner, "fp-"+owner)
			require.Equal(t, backends.StatusCompleted, res.Status, owner)
			require.Equal(t, []byte("out"), res.Output, owner)
			require.Equal(t, t0.UnixMicro(), res.CompletedAt.UnixMicro(), owner)
			require.Equal(t, rec, inspect(t, after, "done"), owner)
		}

		// After a release: a new lease, neither a takeover nor a
		// re-entry, with the counters moved once.
		l = acquireFP(t, early, "released", "a", "fp-a").Lease
		require.NoError(t, early.Release(ctx(t), l))
		res = acquireFP(t, after, "released", "b", "fp-b")
		require.Equal(t, backends.Lease{Key: "released", Owner: "b", Token: 2, Attempt: 2}, res.Lease)
		require.Equal(t, "b", inspect(t, after, "released").Owner)

		// Past its retention a record counts as absent: a fresh start,
		// the fencing token still above the old one.
		l = acquireFP(t, early, "forgotten", "a", "fp-a").Lease
		require.NoError(t, early.Complete(ctx(t), l, []byte("out")))
		res = acquireFP(t, forgotten, "forgotten", "b", "fp-b")
		require.Equal(t, backends.Lease{Key: "forgotten", Owner: "b", Token: 2, Attempt: 1}, res.Lease)
		require.Equal(t, []byte("fp-b"), res.Fingerprint)
		rec = inspect(t, forgotten, "forgotten")
		require.Equal(t, backends.StateInProgress, rec.State)
		require.Nil(t, rec.Output)
		require.True(t, rec.CompletedAt.IsZero())
	})
}

// Trap: a server's affected-row count for INSERT ... ON DUPLICATE KEY
// UPDATE is 1 for an insert and 2 for any update, so it cannot tell a
// re-entry from a takeover. Acquire records its decision in the `how`
// column and reads the row back, and reports the two apart.
func TestAcquireTellsReentryFromTakeover(t *testing.T) {
	t.Parallel()
	t.Run("the count", func(t *testing.T) {
		t.Parallel()
		c := newClocks(t, mysqlstore.FlavorDetect)
		s, err := mysqlstore.New(openDB(t, 1, nil), c.opts)
		require.NoError(t, err)
		_, early := c.open(0)
		_, later := c.open(time.Second)
		_, late := c.open(10 * time.Minute)
		upsert := func(db *sql.DB, owner string) int64 {
			res, err := rawUpsert(t, s, db).Exec(map[string]any{"key": []byte("k"), "owner": []byte(owner), "ttl": int64(60e6), "ret": int64(3600e6), "fp": nil})
			require.NoError(t, err)
			n, err := res.RowsAffected()
			require.NoError(t, err)
			return n
		}
		require.EqualValues(t, 1, upsert(early, "a"), "a new record")
		require.EqualValues(t, 2, upsert(later, "a"), "a re-entry")
		require.EqualValues(t, 2, upsert(late, "b"), "a takeover: the same count")
	})
	for _, flavor := range flavors {
		t.Run(flavor.String(), func(t *testing.T) {
			t.Parallel()
			c := newClocks(t, flavor)
			_, early := c.at(0)
			later, again := c.at(time.Second)
			late, after := c.at(10 * time.Minute)

			require.Equal(t, backends.Lease{Key: "k", Owner: "a", Token: 1, Attempt: 1}, acquireFP(t, early, "k", "a", "").Lease)

			res := acquireFP(t, again, "k", "a", "")
			require.Equal(t, backends.Lease{Key: "k", Owner: "a", Token: 1, Attempt: 1}, res.Lease,
				"a re-entry: the same token and attempt")
			require.True(t, res.Reentrant)
			rec := inspect(t, again, "k")
			require.Equal(t, "a", rec.Owner)
			require.Equal(t, later.Add(time.Minute).UnixMicro(), rec.LeaseExpiresAt.UnixMicro(), "the lease runs from the re-entry")

			res = acquireFP(t, after, "k", "b", "")
			require.Equal(t, backends.Lease{Key: "k", Owner: "b", Token: 2, Attempt: 2, Takeover: true}, res.Lease,
				"a takeover: the next token and attempt")
			rec = inspect(t, after, "k")
			require.Equal(t, "b", rec.Owner)
			require.Equal(t, late.Add(time.Minute).UnixMicro(), rec.LeaseExpiresAt.UnixMicro())
		})
	}
}

// upsert is Acquire's statement without its RETURNING clause, run raw.
type upsert struct {
	db    *sql.DB
	sql   string
	names []string
}

// rawUpsert takes Acquire's upsert from s, to run it on db.
func rawUpsert(t *testing.T, s *mysqlstore.Store, db *sql.DB) upsert {
	t.Helper()
	u := upsert{db: db}
	u.sql, u.names = mysqlstore.AcquireUpsert(s)
	require.NotContains(t, u.sql, "RETURNING")
	return u
}

func (u upsert) Exec(vals map[string]any) (sql.Result, error) {
	args := make([]any, len(u.names))
	for i, n := range u.names {
		args[i] = vals[n]
	}
	return u.db.Exec(u.sql, args...)
}

// Trap: a server reports the rows an UPDATE changed, not those it matched
// (unless the DSN sets clientFoundRows). A renewal by a clock that has
// not moved sets the lease to the values it already has: the server
// reports no row, and the store must check with a read before it calls
// the lease lost.
func TestUnchangedUpdateStillHoldsTheLease(t *testing.T) {
	t.Parallel()
	c := newClocks(t, mysqlstore.FlavorDetect)
	_, early := c.at(0)
	_, late := c.at(10 * time.Minute)
	l := acquireFP(t, early, "k", "a", "").Lease
	before := inspect(t, early, "k")
	for range 2 {
		require.NoError(t, early.Renew(ctx(t), l, time.Minute), "matched but unchanged")
	}
	require.Equal(t, before, inspect(t, early, "k"))

	stale := l
	stale.Token++
	require.ErrorIs(t, early.Renew(ctx(t), stale, time.Minute), backends.ErrLeaseLost, "the read does not hide a lease that is not held")
	require.Equal(t, backends.StatusAcquired, acquireFP(t, late, "k", "b", "").Status)
	require.ErrorIs(t, early.Renew(ctx(t), l, time.Minute), backends.ErrLeaseLost, "nor one taken over")
}

// Trap: an upsert that changes nothing still writes the row if any
// assignment leaves a value different from the old one. A duplicate of a
// completed key or of another owner's lease leaves every column as it
// was, `how` included, so the server writes nothing for it and its commit
// waits for no log flush; only a fingerprint to adopt is a write. The
// server's Handler_update counts the rows its session updated.
func TestDuplicateAcquireWritesNothing(t *testing.T) {
	eachFlavor(t, func(t *testing.T, flavor mysqlstore.Flavor) {
		db := openDB(t, 1, nil) // one connection: the session whose count is read
		s := newStore(t, db, mysqlstore.Options{Flavor: flavor})
		ctx := context.Background()
		done := acquire(t, s, "done", "holder", time.Minute).Lease
		require.NoError(t, s.Complete(ctx, done, []byte("out")))
		acquire(t, s, "held", "holder", time.Minute)
		updates := func() int64 {
			var name string
			var n int64
			require.NoError(t, db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Handler_update'").Scan(&name, &n))
			return n
		}
		before := updates()
		for i := range 3 {
			owner := fmt.Sprintf("dup-%d", i)
			res := acquire(t, s, "done", owner, time.Minute)
			require.Equal(t, backends.StatusCompleted, res.Status)
			require.Equal(t, []byte("out"), res.Output)
			res = acquire(t, s, "held", owner, time.Minute)
			require.Equal(t, backends.StatusInProgress, res.Status)
		}
		require.Equal(t, before, updates(), "a duplicate updated a row")

		// What a duplicate cannot only read still writes: a
		// fingerprint for a record without one is adopted.
		res, err := s.Acquire(ctx, backends.AcquireRequest{Key: "held", Owner: "dup", LeaseTTL: time.Minute, Retention: time.Hour, Fingerprint: []byte("fp")})
		require.NoError(t, err)
		require.Equal(t, backends.StatusInProgress, res.Status)
		require.Equal(t, []byte("fp"), res.Fingerprint)
		require.Greater(t, updates(), before, "the fingerprint was adopted")
	})
}

// A completion within its lease changes no indexed column: forget_us
// stays as Acquire set it, a bound past the completion plus the
// retention, so InnoDB writes nothing to the forget_us index (the last
// change to any of its pages, INNODB_BUFFER_PAGE's NEWEST_MODIFICATION,
// stays where it was). A completion after the lease's end moves forget_us
// to that time.
func TestCompleteWithinLeaseLeavesTheIndex(t *testing.T) {
	t.Parallel()
	db := openDB(t, 2, nil)
	s := newStore(t, db, mysqlstore.Options{})
	ctx := context.Background()
	table := s.Options().Table
	row := func(key string) (forget, bound int64) {
		t.Helper()
		require.NoError(t, db.QueryRowContext(ctx, "SELECT forget_us, COALESCE(completed_us, 0) + retention_us FROM `"+table+"` WHERE `key` = ?",
			[]byte(key)).Scan(&forget, &bound))
		return forget, bound
	}
	indexChanged := func() (lsn int64) {
		t.Helper()
		require.NoError(t, db.QueryRowContext(ctx, "SELECT COALESCE(MAX(NEWEST_MODIFICATION), 0) FROM information_schema.INNODB_BUFFER_PAGE WHERE INDEX_NAME = ? AND TABLE_NAME LIKE ?",
			table+"_fa", "%`"+table+"`").Scan(&lsn))
		return lsn
	}
	const n = 20
	leases := make([]backends.Lease, n)
	before := make([]int64, n)
	for i := range leases {
		leases[i] = acquire(t, s, fmt.Sprint("k", i), "holder", time.Minute).Lease
		before[i], _ = row(leases[i].Key)
	}
	lsn := indexChanged()
	require.NotZero(t, lsn, "the index's pages are in the buffer pool")
	for i, l := range leases {
		require.NoError(t, s.Complete(ctx, l, nil))
		forget, bound := row(l.Key)
		require.Equal(t, before[i], forget, "forget_us as Acquire set it")
		require.GreaterOrEqual(t, forget, bound, "forget_us is past the completion plus the retention")
		rec, err := s.Inspect(ctx, l.Key)
		require.NoError(t, err)
		require.Equal(t, backends.StateCompleted, rec.State)
		require.Equal(t, bound, rec.ExpiresAt.UnixMicro(), "Inspect tells the end of the retention, not forget_us")
	}
	require.Equal(t, lsn, indexChanged(), "a completion wrote to the forget_us index")

	// After the lease's end (the record not yet forgotten: its retention
	// is long), the completion moves forget_us to the completion plus the
	// retention.
	late := acquire(t, s, "late", "holder", time.Millisecond).Lease
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, s.Complete(ctx, late, nil))
	forget, bound := row("late")
	require.Equal(t, bound, forget)
	require.Greater(t, indexChanged(), lsn)
}

// Acquire first sends the insert of a new record. On MariaDB its update
// changes nothing and it returns the row, and the upsert follows only for
// a record the upsert would change: a new key, a completed one and
// another owner's live lease take one statement; the owner's own lease
// again, a released or expired lease, a record past its retention and a
// fingerprint to adopt take two, and answer as the upsert does. On MySQL
// a new key takes the insert alone, and a key with a record the insert
// (refused: a duplicate key), then the upsert and the read of its row in
// a transaction. Each call runs on a pool of one connection whose clock
// stands at its own time, and the session's Com_stmt_execute counts the
// prepared statements it ran.
func TestAcquireSendsTheUpsertOnlyForAChange(t *testing.T) {
	eachFlavor(t, testAcquireStatements)
}

func testAcquireStatements(t *testing.T, flavor mysqlstore.Flavor) {
	c := newClocks(t, flavor)
	// call runs one Acquire at d after t0 and returns its answer and how
	// many statements it sent.
	call := func(d time.Duration, key, owner, fp string) (backends.AcquireResult, int64) {
		t.Helper()
		at := c.t0.Add(d)
		db := openDB(t, 1, map[string]string{"timestamp": fmt.Sprintf("%d.%06d", at.Unix(), at.Nanosecond()/1000)})
		s, err := mysqlstore.New(db, c.opts)
		require.NoError(t, err)
		_, err = mysqlstore.DetectFlavor(ctx(t), s) // prepared and executed are two counters: count from here
		require.NoError(t, err)
		executed := func() int64 {
			var name string
			var n int64
			require.NoError(t, db.QueryRowContext(ctx(t), "SHOW SESSION STATUS LIKE 'Com_stmt_execute'").Scan(&name, &n))
			return n
		}
		before := executed()
		req := backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: time.Minute, Retention: time.Hour}
		if fp != "" {
			req.Fingerprint = []byte(fp)
		}
		res, err := s.Acquire(ctx(t), req)
		require.NoError(t, err)
		return res, executed() - before
	}
	_, s := c.at(0)
	// expect checks a call's answer, and that it sent one statement if
	// answered, else two, on MariaDB; one for a new key, else three, on
	// MySQL.
	expect := func(name string, res backends.AcquireResult, sent int64, status backends.Status, answered, newKey bool) {
		t.Helper()
		require.Equal(t, status, res.Status, name)
		want := map[bool]int64{true: 1, false: 2}[answered]
		if flavor == mysqlstore.FlavorMySQL {
			want = map[bool]int64{true: 1, false: 3}[newKey]
		}
		require.Equal(t, want, sent, "%s: statements sent", name)
	}

	res, n := call(0, "done", "a", "fp")
	expect("a new key", res, n, backends.StatusAcquired, true, true)
	require.Equal(t, backends.Lease{Key: "done", Owner: "a", Token: 1, Attempt: 1}, res.Lease)
	require.False(t, res.Reentrant)
	require.Equal(t, []byte("fp"), res.Fingerprint)
	require.NoError(t, s.Complete(ctx(t), res.Lease, []byte("out")))
	res, n = call(time.Second, "done", "b", "fp")
	expect("a completed key", res, n, backends.StatusCompleted, true, false)
	require.Equal(t, []byte("out"), res.Output)

	held, n := call(0, "held", "a", "")
	expect("a new key without a fingerprint", held, n, backends.StatusAcquired, true, true)
	require.Nil(t, held.Fingerprint)
	res, n = call(time.Second, "held", "b", "")
	expect("another's live lease", res, n, backends.StatusInProgress, true, false)
	require.Equal(t, time.Minute-time.Second, res.Remaining)
	res, n = call(2*time.Second, "held", "a", "")
	expect("the owner's own lease again", res, n, backends.StatusAcquired, false, false)
	require.True(t, res.Reentrant)
	require.Equal(t, held.Lease, res.Lease)
	res, n = call(3*time.Second, "held", "b", "fp")
	expect("a fingerprint to adopt", res, n, backends.StatusInProgress, false, false)
	require.Equal(t, []byte("fp"), res.Fingerprint)
	res, n = call(3*time.Minute, "held", "b", "fp")
	expect("an expired lease", res, n, backends.StatusAcquired, false, false)
	require.True(t, res.Lease.Takeover)
	require.Equal(t, int64(2), res.Lease.Token)

	res, n = call(0, "released", "a", "")
	expect("a new key to release", res, n, backends.StatusAcquired, true, true)
	require.NoError(t, s.Release(ctx(t), res.Lease))
	res, n = call(time.Second, "released", "b", "")
	expect("a released lease", res, n, backends.StatusAcquired, false, false)
	require.Equal(t, int64(2), res.Lease.Token)

	res, n = call(2*time.Hour, "done", "c", "")
	expect("a record past its retention", res, n, backends.StatusAcquired, false, false)
	require.Equal(t, 1, res.Lease.Attempt)
}

// A record's completed_us is 0, not NULL, until it completes, on every
// path that makes a lease new (the insert, and the upsert of a record
// past its retention), so that a completion writes a BIGINT over a BIGINT
// and InnoDB updates the record in place; a NULL filled in would lengthen
// the record, and InnoDB would write it anew in its page.
func TestANewRecordCompletesInPlace(t *testing.T) {
	eachFlavor(t, func(t *testing.T, flavor mysqlstore.Flavor) {
		c := newClocks(t, flavor)
		_, s := c.at(0)
		_, db := c.open(0)
		completed := func(key string) sql.NullInt64 {
			t.Helper()
			var v sql.NullInt64
			require.NoError(t, db.QueryRowContext(ctx(t), "SELECT completed_us FROM `"+s.Options().Table+"` WHERE `key` = ?", []byte(key)).Scan(&v))
			return v
		}
		zero := sql.NullInt64{Valid: true}
		res := acquire(t, s, "k", "a", time.Minute)
		require.Equal(t, zero, completed("k"), "a new record")
		require.NoError(t, s.Complete(ctx(t), res.Lease, nil))
		require.Equal(t, c.t0.UnixMicro(), completed("k").Int64, "a completed record")

		_, later := c.at(2 * time.Hour)
		res = acquire(t, later, "k", "b", time.Minute)
		require.Equal(t, backends.StatusAcquired, res.Status)
		require.Equal(t, zero, completed("k"), "a record past its retention, new again")
		require.True(t, inspect(t, later, "k").CompletedAt.IsZero())
	})
}
