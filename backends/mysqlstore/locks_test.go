package mysqlstore_test

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
)

var deadlockMu sync.Mutex

// deadlock makes call, a store call that updates key's record, the
// victim of a real deadlock, once. Another transaction first writes
// ballast rows, so that it is the heavier of the two and InnoDB rolls the
// call back rather than it, and takes the gap at the end of the table's
// forget_us index. The call locks key's record and waits for that gap,
// where its new forget_us goes; the transaction then asks for key's
// record, closing the cycle. It gets the record once the call is rolled
// back, and commits. call's error is returned, and the deadlock detected
// is checked on the server.
func deadlock(t *testing.T, db *sql.DB, table, key string, call func() error) error {
	t.Helper()
	// One at a time: the server refreshes INNODB_TRX only once it has
	// gone 0.1 s unread, which pollers in parallel could prevent.
	deadlockMu.Lock()
	defer deadlockMu.Unlock()
	deadlocks := func() (n int64) {
		var name string
		require.NoError(t, db.QueryRow("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'").Scan(&name, &n))
		return n
	}
	before := deadlocks()

	other, err := db.BeginTx(ctx(t), nil)
	require.NoError(t, err)
	defer other.Rollback() //nolint:errcheck // after Commit it is a no-op
	const ballast = 16
	rows := make([]string, ballast)
	args := make([]any, ballast)
	for i := range rows {
		rows[i] = "(?, 2, 'ballast', 1, 1, 0, 0, 0)" // forgotten at once: no store call sees them
		args[i] = fmt.Appendf(nil, "ballast-%s-%d", key, i)
	}
	_, err = other.Exec("INSERT INTO `"+table+"` (`key`, state, owner, token, attempt, lease_expires_us, retention_us, forget_us) VALUES "+
		strings.Join(rows, ", "), args...)
	require.NoError(t, err)
	// The gap above the largest forget_us. (Above the largest BIGINT
	// instead, the optimizer sees that no row can match, and locks none.)
	var last, n int64
	require.NoError(t, other.QueryRow("SELECT MAX(forget_us) FROM `"+table+"`").Scan(&last))
	require.NoError(t, other.QueryRow("SELECT COUNT(*) FROM `"+table+"` FORCE INDEX (`"+table+"_fa`) WHERE forget_us > ? FOR UPDATE",
		last).Scan(&n))

	done := make(chan error, 1)
	go func() { done <- call() }()
	require.Eventually(t, func() bool {
		var waiting int
		err := db.QueryRow("SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE ?",
			"%`"+table+"`%").Scan(&waiting)
		return err == nil && waiting == 1
	}, 10*time.Second, 250*time.Millisecond, "the call waits for the gap")

	var state int
	require.NoError(t, other.QueryRow("SELECT state FROM `"+table+"` WHERE `key` = ? FOR UPDATE", []byte(key)).Scan(&state),
		"the call, not the heavier transaction, is the deadlock's victim")
	require.NoError(t, other.Commit())
	err = <-done
	require.Greater(t, deadlocks(), before, "the server detected a deadlock")
	return err
}

// A deadlock (1213) rolls back the store's own statement, or Acquire's
// transaction on MySQL, and nothing else: the store runs it again, and
// the call succeeds.
func TestDeadlockIsRetried(t *testing.T) {
	t.Parallel()
	db := openDB(t, 4, nil)
	calls := map[string]func(t *testing.T, s *mysqlstore.Store){
		"acquire": func(t *testing.T, s *mysqlstore.Store) {
			l := acquire(t, s, "k", "a", time.Minute).Lease
			var res backends.AcquireResult
			require.NoError(t, deadlock(t, db, s.Options().Table, "k", func() (err error) {
				res, err = s.Acquire(ctx(t), backends.AcquireRequest{Key: "k", Owner: "a", LeaseTTL: time.Hour, Retention: time.Hour})
				return err
			}))
			require.Equal(t, backends.StatusAcquired, res.Status)
			require.True(t, res.Reentrant)
			require.Equal(t, l.Token, res.Lease.Token)
		},
		"renew": func(t *testing.T, s *mysqlstore.Store) {
			l := acquire(t, s, "k", "a", time.Minute).Lease
			require.NoError(t, deadlock(t, db, s.Options().Table, "k", func() error { return s.Renew(ctx(t), l, time.Hour) }))
			rec, err := s.Inspect(ctx(t), "k")
			require.NoError(t, err)
			require.WithinDuration(t, time.Now().Add(time.Hour), rec.LeaseExpiresAt, time.Minute)
		},
		"complete": func(t *testing.T, s *mysqlstore.Store) {
			// A lease of a millisecond, ended before Complete: completion
			// moves forget_us up, to the end of the index, into the gap.
			l := acquire(t, s, "k", "a", time.Millisecond).Lease
			require.NoError(t, deadlock(t, db, s.Options().Table, "k", func() error { return s.Complete(ctx(t), l, []byte("out")) }))
			rec, err := s.Inspect(ctx(t), "k")
			require.NoError(t, err)
			require.Equal(t, backends.StateCompleted, rec.State)
		},
	}
	for _, flavor := range []mysqlstore.Flavor{mysqlstore.FlavorMariaDB, mysqlstore.FlavorMySQL} {
		for name, call := range calls {
			t.Run(flavor.String()+"/"+name, func(t *testing.T) {
				call(t, newStore(t, db, mysqlstore.Options{Flavor: flavor}))
			})
		}
	}
}

// A deadlock inside the caller's transaction rolls the whole transaction
// back, the handler's writes with it, and ends it: CompleteTx does not run
// its statement again (it would commit on its own, without the work), and
// the key stays in progress for a redelivery.
func TestCompleteTxDeadlockRollsBackTheTransaction(t *testing.T) {
	t.Parallel()
	db := openDB(t, 4, nil)
	s := newStore(t, db, mysqlstore.Options{})
	table := s.Options().Table
	l := acquire(t, s, "k", "a", time.Millisecond).Lease // completion moves forget_us up (see TestDeadlockIsRetried)

	tx, err := db.BeginTx(ctx(t), nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	_, err = tx.Exec("INSERT INTO `"+table+"` (`key`, state, owner, token, attempt, lease_expires_us, retention_us, forget_us) VALUES (?, 2, 'work', 1, 1, 0, 0, 0)", []byte("work"))
	require.NoError(t, err)
	err = deadlock(t, db, table, "k", func() error { return s.CompleteTx(ctx(t), tx, l, nil) })
	var myErr *mysql.MySQLError
	require.True(t, errors.As(err, &myErr), "%v", err)
	require.EqualValues(t, 1213, myErr.Number)

	var n int
	require.NoError(t, tx.QueryRow("SELECT COUNT(*) FROM `"+table+"` WHERE `key` = ?", []byte("work")).Scan(&n))
	require.Zero(t, n, "the handler's write was rolled back with the transaction")
	// What a handler that carried on would write is outside any
	// transaction now: its rollback cannot undo it.
	_, err = tx.Exec("INSERT INTO `"+table+"` (`key`, state, owner, token, attempt, lease_expires_us, retention_us, forget_us) VALUES (?, 2, 'work', 1, 1, 0, 0, 0)", []byte("after"))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM `"+table+"` WHERE `key` = ?", []byte("after")).Scan(&n))
	require.Equal(t, 1, n, "committed on its own")
	rec, err := s.Inspect(ctx(t), "k")
	require.NoError(t, err)
	require.NotEqual(t, backends.StateCompleted, rec.State)
	require.NoError(t, s.Complete(ctx(t), l, nil), "the lease is still held")
}

// A lock wait timeout (1205) inside the caller's transaction rolls back
// only CompleteTx's statement (innodb_rollback_on_timeout is OFF by
// default): the transaction is still open, with the handler's writes, but
// without the completion. Committing it would record the work and leave
// the key to be processed again, so the caller rolls back.
func TestCompleteTxLockWaitRollsBackTheStatement(t *testing.T) {
	t.Parallel()
	db := openDB(t, 4, map[string]string{"innodb_lock_wait_timeout": "2"})
	s := newStore(t, db, mysqlstore.Options{})
	table := s.Options().Table
	l := acquire(t, s, "k", "a", time.Minute).Lease
	var rollbackOnTimeout bool
	require.NoError(t, db.QueryRow("SELECT @@innodb_rollback_on_timeout").Scan(&rollbackOnTimeout))
	require.False(t, rollbackOnTimeout, "the server's default")

	other, err := db.BeginTx(ctx(t), nil)
	require.NoError(t, err)
	defer other.Rollback() //nolint:errcheck // after Commit it is a no-op
	var state int
	require.NoError(t, other.QueryRow("SELECT state FROM `"+table+"` WHERE `key` = ? FOR UPDATE", []byte("k")).Scan(&state))

	tx, err := db.BeginTx(ctx(t), nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	_, err = tx.Exec("INSERT INTO `"+table+"` (`key`, state, owner, token, attempt, lease_expires_us, retention_us, forget_us) VALUES (?, 2, 'work', 1, 1, 0, 0, 0)", []byte("work"))
	require.NoError(t, err)
	start := time.Now()
	err = s.CompleteTx(ctx(t), tx, l, nil)
	var myErr *mysql.MySQLError
	require.True(t, errors.As(err, &myErr), "%v", err)
	require.EqualValues(t, 1205, myErr.Number)
	require.Less(t, time.Since(start), 4*time.Second, "one lock wait, not run again inside the caller's transaction")

	var n int
	require.NoError(t, tx.QueryRow("SELECT COUNT(*) FROM `"+table+"` WHERE `key` = ?", []byte("work")).Scan(&n))
	require.Equal(t, 1, n, "the transaction is still open, with the handler's write")
	require.NoError(t, tx.Rollback())
	require.NoError(t, other.Commit())
	require.NoError(t, s.Complete(ctx(t), l, nil), "the lease is still held")
}
