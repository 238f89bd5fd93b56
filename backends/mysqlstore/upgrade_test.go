package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
)

// v010 runs the schema and statements of mysqlstore 0.1.0
// (testdata/v0.1.0) on a table: an instance not yet upgraded, during a
// rolling upgrade.
type v010 struct {
	t                         *testing.T
	db                        *sql.DB
	table                     string // quoted
	schema, acquire, complete string
	names                     []string // of the acquire statement's parameters
}

func newV010(t *testing.T, db *sql.DB, table string) *v010 {
	vars := map[string]string{
		"Table": "`" + table + "`",
		"Index": "`" + table + "_fa`",
		"Now":   `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`,
	}
	render := func(name string) string {
		src, err := os.ReadFile("testdata/v0.1.0/" + name)
		require.NoError(t, err)
		var b strings.Builder
		require.NoError(t, template.Must(template.New(name).Parse(string(src))).Execute(&b, vars))
		return b.String()
	}
	o := &v010{t: t, db: db, table: vars["Table"], schema: render("schema.sql"), complete: render("complete.sql")}
	o.acquire = regexp.MustCompile(`:[a-z]+`).ReplaceAllStringFunc(render("acquire.sql"), func(p string) string {
		o.names = append(o.names, p[1:])
		return "?"
	})
	return o
}

// take acquires key for owner as 0.1.0 does, within ctx.
func (o *v010) take(ctx context.Context, key, owner string) error {
	vals := map[string]any{"key": []byte(key), "owner": []byte(owner), "ttl": int64(60e6), "ret": int64(3600e6), "fp": nil}
	args := make([]any, len(o.names))
	for i, n := range o.names {
		args[i] = vals[n]
	}
	_, err := o.db.ExecContext(ctx, o.acquire, args...)
	return err
}

func (o *v010) mustTake(key, owner string) int64 {
	o.t.Helper()
	require.NoError(o.t, o.take(context.Background(), key, owner))
	var token int64
	var rowOwner []byte
	require.NoError(o.t, o.db.QueryRow("SELECT token, owner FROM "+o.table+" WHERE `key` = ?", []byte(key)).Scan(&token, &rowOwner))
	require.Equal(o.t, owner, string(rowOwner), "0.1.0 acquired %s", key)
	return token
}

// instantAlters is the server's count of ALTER TABLEs done instantly,
// on MariaDB; -1 on a server that does not count them.
func instantAlters(t *testing.T, db *sql.DB) int64 {
	var name string
	var n int64
	err := db.QueryRow("SHOW GLOBAL STATUS LIKE 'Innodb_instant_alter_column'").Scan(&name, &n)
	if err == sql.ErrNoRows {
		return -1
	}
	require.NoError(t, err)
	return n
}

// A table of 0.1.0 gets this version's columns from Migrate, instantly
// on MariaDB, while instances of 0.1.0 keep using it, and neither waits
// for the other for long: a transaction holds the table (a handler's,
// around CompleteTx), and while Migrate waits for the table's metadata
// lock 0.1.0's Acquire still runs, where an ALTER TABLE waiting for the
// server's default lock_wait_timeout (a day on MariaDB, a year on MySQL)
// would hold up every call behind it until that transaction ends. The
// records 0.1.0 wrote are read with no origin and no acquisition time; an
// acquisition by 0.1.0 leaves those of the lease before it
// (docs/upgrading.md). The 30 s bounds only end the test if a call waits.
func TestUpgradeFrom010(t *testing.T) {
	t.Parallel()
	db := openDB(t, 8, nil)
	ctx := context.Background()
	table := fmt.Sprintf("idem_from_010_%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`") })
	old := newV010(t, db, table)
	_, err := db.Exec(old.schema)
	require.NoError(t, err)

	token := old.mustTake("done", "old-a")
	res, err := db.Exec(old.complete, []byte("out"), []byte("done"), []byte("old-a"), token)
	require.NoError(t, err)
	n, err := res.RowsAffected()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	old.mustTake("held", "old-b")

	blocker, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer blocker.Rollback() //nolint:errcheck
	var one int
	require.NoError(t, blocker.QueryRow("SELECT 1 FROM `"+table+"` LIMIT 1").Scan(&one), "the transaction holds the table's metadata lock")

	instant := instantAlters(t, db)
	s, err := mysqlstore.New(db, mysqlstore.Options{Table: table})
	require.NoError(t, err)
	migrated := make(chan error, 1)
	go func() { migrated <- s.Migrate(ctx) }()

	// Once Migrate has waited for the table's lock, 0.1.0's calls run
	// while it keeps trying.
	require.Eventually(t, func() bool {
		var waiting int
		err := db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'Waiting for table metadata lock' AND INFO LIKE ?",
			"ALTER TABLE %`"+table+"`%").Scan(&waiting)
		return err == nil && waiting > 0
	}, 30*time.Second, time.Millisecond, "Migrate waits for the table's lock")
	for i := range 3 {
		bounded, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := old.take(bounded, fmt.Sprintf("during-%d", i), "old-c")
		cancel()
		require.NoError(t, err, "0.1.0's Acquire %d while Migrate waits for the table", i)
	}
	select {
	case err := <-migrated:
		t.Fatalf("Migrate returned while a transaction held the table: %v", err)
	default:
	}
	require.NoError(t, blocker.Rollback())
	require.NoError(t, <-migrated)
	if instant >= 0 {
		require.Equal(t, instant+1, instantAlters(t, db), "the columns were added instantly")
	}
	require.NoError(t, s.Migrate(ctx), "and again")

	// What 0.1.0 wrote, read by this version.
	rec, err := s.Inspect(ctx, "done")
	require.NoError(t, err)
	require.Equal(t, backends.StateCompleted, rec.State)
	require.True(t, rec.LeaseExpiresAt.Equal(rec.CompletedAt))
	require.Empty(t, rec.Origin)
	require.Zero(t, rec.AcquiredAt)
	rec, err = s.Inspect(ctx, "held")
	require.NoError(t, err)
	require.Equal(t, backends.StateInProgress, rec.State)
	require.Zero(t, rec.AcquiredAt)
	c, err := s.Count(ctx, "")
	require.NoError(t, err)
	require.Equal(t, backends.Counts{InProgress: 4, Completed: 1}, c, "no oldest lease in progress: 0.1.0 kept no time")

	ar, err := s.Acquire(ctx, backends.AcquireRequest{Key: "new", Owner: "new-a", LeaseTTL: time.Minute, Retention: time.Hour, Origin: "message_uuid=a handler=h"})
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, ar.Status)
	rec, err = s.Inspect(ctx, "new")
	require.NoError(t, err)
	require.Equal(t, "message_uuid=a handler=h", rec.Origin)
	c, err = s.Count(ctx, "")
	require.NoError(t, err)
	require.True(t, rec.AcquiredAt.Equal(c.OldestInProgress), "the oldest lease whose time is known")

	// 0.1.0 on this version's records: a completed key stays completed
	// (the row is left as it was), a lease held by another owner held.
	require.NoError(t, s.Complete(ctx, ar.Lease, nil))
	require.NoError(t, old.take(ctx, "new", "old-d"))
	rec, err = s.Inspect(ctx, "new")
	require.NoError(t, err)
	require.Equal(t, backends.StateCompleted, rec.State, "0.1.0 drops a duplicate of a key this version completed")
	ar, err = s.Acquire(ctx, backends.AcquireRequest{Key: "mixed", Owner: "new-b", LeaseTTL: time.Minute, Retention: time.Hour, Origin: "message_uuid=b handler=h"})
	require.NoError(t, err)
	require.NoError(t, old.take(ctx, "mixed", "old-e"))
	first, err := s.Inspect(ctx, "mixed")
	require.NoError(t, err)
	require.Equal(t, "new-b", first.Owner, "in progress for 0.1.0")

	// A lease 0.1.0 takes keeps the origin and time of the lease before.
	require.NoError(t, s.Release(ctx, ar.Lease))
	old.mustTake("mixed", "old-e")
	rec, err = s.Inspect(ctx, "mixed")
	require.NoError(t, err)
	require.Equal(t, "message_uuid=b handler=h", rec.Origin, "the origin of the lease before")
	require.True(t, first.AcquiredAt.Equal(rec.AcquiredAt), "the time of the lease before")
}
