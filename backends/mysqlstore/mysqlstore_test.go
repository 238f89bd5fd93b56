package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/storetest"
)

// dsn is the test database, $MYSQL_DSN: `make test` starts a private
// MariaDB and sets it. A test without it fails; it never falls back to a
// server on the default port, which may be one the user runs.
func dsn(t testing.TB) string {
	t.Helper()
	v := os.Getenv("MYSQL_DSN")
	if v == "" {
		t.Fatal("MYSQL_DSN is not set. Run the tests with `make test`, which starts a private MariaDB and sets it, " +
			"or set it to a database the tests may write to")
	}
	return v
}

// openDB connects to the test database with params added to the DSN
// (such as time_zone), at most maxConns connections; a missing server
// fails the test.
func openDB(t testing.TB, maxConns int, params map[string]string) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn(t))
	require.NoError(t, err)
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	for k, v := range params {
		cfg.Params[k] = v
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	db.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, db.PingContext(ctx), "MariaDB or MySQL at MYSQL_DSN (%s)", dsn(t))
	return db
}

var tableSeq atomic.Int64

// newStore returns a migrated store on a table of its own, dropped when
// the test ends.
func newStore(t testing.TB, db *sql.DB, opts mysqlstore.Options) *mysqlstore.Store {
	t.Helper()
	opts.Table = fmt.Sprintf("idem_test_%d_%d", time.Now().UnixNano()%1e9, tableSeq.Add(1))
	s, err := mysqlstore.New(db, opts)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	t.Cleanup(func() {
		_, err := db.Exec("DROP TABLE IF EXISTS `" + opts.Table + "`")
		require.NoError(t, err)
	})
	return s
}

func TestConformance(t *testing.T) {
	t.Parallel()
	db := openDB(t, 32, nil)
	t.Run("detected", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Fixture {
			return storetest.Fixture{Store: newStore(t, db, mysqlstore.Options{})}
		})
	})
	s, err := mysqlstore.New(db, mysqlstore.Options{})
	require.NoError(t, err)
	flavor, err := mysqlstore.DetectFlavor(context.Background(), s)
	require.NoError(t, err)
	t.Logf("detected %s", flavor)
}

// The path MySQL 8 takes (no RETURNING: the upsert and a read in one
// transaction), run on MariaDB.
func TestConformanceWithoutReturning(t *testing.T) {
	t.Parallel()
	db := openDB(t, 32, nil)
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		return storetest.Fixture{Store: newStore(t, db, mysqlstore.Options{Flavor: mysqlstore.FlavorMySQL})}
	})
}

// ctx is the tests' context: it ends with the test.
func ctx(t testing.TB) context.Context { return t.Context() }

// acquire asks s for key on behalf of owner, with a lease of ttl and an
// hour's retention, and fails the test on an error.
func acquire(t testing.TB, s backends.Store, key, owner string, ttl time.Duration) backends.AcquireResult {
	t.Helper()
	res, err := s.Acquire(t.Context(), backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: ttl, Retention: time.Hour,
		Origin: "message_uuid=" + owner + " handler=test"})
	require.NoError(t, err, "acquire %q", key)
	return res
}

// Keys are bytes: under a case-insensitive collation `order-A`,
// `ORDER-a` and `order-a ` (a trailing space) would be one key.
func TestCaseVariantKeysAreDistinct(t *testing.T) {
	t.Parallel()
	s := newStore(t, openDB(t, 4, nil), mysqlstore.Options{})
	for _, key := range []string{"order-A", "ORDER-a", "order-a", "order-a ", "orde\u0301r-a"} {
		require.Equal(t, backends.StatusAcquired, acquire(t, s, key, "owner-"+key, time.Minute).Status, "key %q", key)
	}
	// Owners are bytes too: another case is another owner.
	res := acquire(t, s, "order-A", "OWNER-order-A", time.Minute)
	require.Equal(t, backends.StatusInProgress, res.Status)
}

// The session's time zone changes nothing: a lease taken by a session at
// +09:00 expires, for a session at -07:00 and by Go's clock, when it
// should.
func TestSessionTimeZoneDoesNotMoveExpiry(t *testing.T) {
	t.Parallel()
	east := openDB(t, 2, map[string]string{"time_zone": "'+09:00'"})
	west := openDB(t, 2, map[string]string{"time_zone": "'-07:00'"})
	s := newStore(t, east, mysqlstore.Options{})
	w, err := mysqlstore.New(west, s.Options())
	require.NoError(t, err)

	before := time.Now()
	l := acquire(t, s, "k", "east", time.Hour).Lease
	after := time.Now()
	for name, st := range map[string]*mysqlstore.Store{"+09:00": s, "-07:00": w} {
		rec, err := st.Inspect(ctx(t), "k")
		require.NoError(t, err)
		require.Equal(t, backends.StateInProgress, rec.State, name)
		require.WithinRange(t, rec.LeaseExpiresAt, before.Add(time.Hour-time.Second), after.Add(time.Hour+time.Second), name)
	}
	res := acquire(t, w, "k", "west", time.Minute)
	require.Equal(t, backends.StatusInProgress, res.Status)
	require.InDelta(t, time.Hour, res.Remaining, float64(5*time.Second), "the same hour seen from -07:00")
	require.NoError(t, w.Renew(ctx(t), l, 2*time.Hour))
	rec, err := s.Inspect(ctx(t), "k")
	require.NoError(t, err)
	require.WithinRange(t, rec.LeaseExpiresAt, before.Add(2*time.Hour-time.Second), time.Now().Add(2*time.Hour+time.Second))
}

// A row lock held longer than the server's lock wait timeout: the
// store's statement times out (1205), is run again, and succeeds once the
// lock is gone.
func TestLockWaitIsRetried(t *testing.T) {
	t.Parallel()
	db := openDB(t, 4, map[string]string{"innodb_lock_wait_timeout": "1"})
	s := newStore(t, db, mysqlstore.Options{})
	l := acquire(t, s, "k", "a", time.Hour).Lease

	tx, err := db.BeginTx(ctx(t), nil)
	require.NoError(t, err)
	var state int
	require.NoError(t, tx.QueryRow("SELECT state FROM `"+s.Options().Table+"` WHERE `key` = ? FOR UPDATE", []byte("k")).Scan(&state))
	go func() {
		time.Sleep(1500 * time.Millisecond) // past one lock wait timeout
		_ = tx.Commit()
	}()
	start := time.Now()
	require.NoError(t, s.Renew(ctx(t), l, time.Hour), "retried past the lock wait timeout")
	require.Greater(t, time.Since(start), time.Second, "it did wait for the lock")
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", dsn(t))
	require.NoError(t, err)
	defer db.Close()
	_, err = mysqlstore.New(nil, mysqlstore.Options{})
	require.ErrorIs(t, err, backends.ErrNilClient)
	require.EqualError(t, err, "mysqlstore: backends: nil client")
	_, err = mysqlstore.New((*sql.DB)(nil), mysqlstore.Options{})
	require.ErrorIs(t, err, backends.ErrNilClient, "a typed nil DB")
	for name, opts := range map[string]mysqlstore.Options{
		"quote in table":   {Table: "idem`keys"},
		"three parts":      {Table: "a.b.c"},
		"name too long":    {Table: strings.Repeat("t", 65)},
		"unknown flavor":   {Flavor: 7},
		"negative flavor":  {Flavor: -1},
		"space in table":   {Table: "idem keys"},
		"empty table part": {Table: "db."},
	} {
		_, err := mysqlstore.New(db, opts)
		require.ErrorIs(t, err, backends.ErrInvalidOptions, name)
	}
	s, err := mysqlstore.New(db, mysqlstore.Options{Table: "app.idem_keys"})
	require.NoError(t, err)
	require.Contains(t, s.MigrationSQL(), "CREATE TABLE IF NOT EXISTS `app`.`idem_keys`")
	// What a migration tool runs: one statement, ended, and no marks of
	// the docs' snippets.
	require.NotContains(t, s.MigrationSQL(), "snippet")
	require.True(t, strings.HasSuffix(s.MigrationSQL(), "ENGINE = InnoDB;\n"), "%q", s.MigrationSQL())
	require.Equal(t, s.MigrationSQL(), s.Schema())
}

// The store reports the db's limit on open connections as it is when
// asked, and 0 (unknown) when the db sets none.
func TestPoolSize(t *testing.T) {
	t.Parallel()
	db := openDB(t, 6, nil)
	s, err := mysqlstore.New(db, mysqlstore.Options{})
	require.NoError(t, err)
	require.Equal(t, 6, s.PoolSize())
	db.SetMaxOpenConns(4)
	require.Equal(t, 4, s.PoolSize(), "the limit as it is now")
	db.SetMaxOpenConns(0)
	require.Zero(t, s.PoolSize(), "no limit")
}

// CompleteTxOutput stores the bytes it is given exactly (not messages to
// encode: here, bytes no message encoding starts with), and only if the
// transaction commits: rolled back, the key stays held by the lease,
// which can still complete it.
func TestCompleteTxOutputStoresTheBytes(t *testing.T) {
	t.Parallel()
	db := openDB(t, 4, nil)
	s := newStore(t, db, mysqlstore.Options{})
	output := []byte("HTTP/1.1 201\x00\xff{\"id\":7}")
	lease := acquire(t, s, "tx-output", "holder", time.Minute).Lease

	require.ErrorIs(t, s.CompleteTxOutput(ctx(t), nil, lease, output), backends.ErrInvalidRequest, "a nil transaction")

	tx, err := db.BeginTx(ctx(t), nil)
	require.NoError(t, err)
	require.NoError(t, s.CompleteTxOutput(ctx(t), tx, lease, output))
	require.NoError(t, tx.Rollback())
	rec, err := s.Inspect(ctx(t), lease.Key)
	require.NoError(t, err)
	require.Equal(t, backends.StateInProgress, rec.State, "rolled back: the key is still held")
	require.Equal(t, lease.Token, rec.Token)
	require.Nil(t, rec.Output)
	require.NoError(t, s.Renew(ctx(t), lease, time.Minute), "the lease still holds the key")

	tx, err = db.BeginTx(ctx(t), nil)
	require.NoError(t, err)
	require.NoError(t, s.CompleteTxOutput(ctx(t), tx, lease, output))
	require.NoError(t, tx.Commit())
	rec, err = s.Inspect(ctx(t), lease.Key)
	require.NoError(t, err)
	require.Equal(t, backends.StateCompleted, rec.State)
	require.Equal(t, output, rec.Output, "the bytes as given")
	dup := acquire(t, s, lease.Key, "duplicate", time.Minute)
	require.Equal(t, backends.StatusCompleted, dup.Status)
	require.Equal(t, output, dup.Output, "a duplicate gets the bytes as given")
}
