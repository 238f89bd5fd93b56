package pgstore_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

// v010 runs the schema and statements of pgstore 0.1.0 (testdata/v0.1.0)
// on a table: an instance not yet upgraded, during a rolling upgrade.
type v010 struct {
	t                         *testing.T
	pool                      *pgxpool.Pool
	schema, acquire, complete string
}

func newV010(t *testing.T, pool *pgxpool.Pool, opts pgstore.Options) *v010 {
	vars := map[string]string{
		"Schema":   pgx.Identifier{opts.Schema}.Sanitize(),
		"Table":    pgx.Identifier{opts.Schema, opts.Table}.Sanitize(),
		"Index":    pgx.Identifier{opts.Table + "_fa"}.Sanitize(),
		"Unlogged": "",
		// 0.1.0's conditions on the existing row.
		"Acquirable": `(r.forget_at <= now() OR r.state = 2 OR (r.state = 1 AND (r.owner = excluded.owner OR r.lease_expires_at <= now())))`,
		"Reentrant":  `(r.forget_at > now() AND r.state = 1 AND r.owner = excluded.owner)`,
	}
	render := func(name string) string {
		src, err := os.ReadFile("testdata/v0.1.0/" + name)
		require.NoError(t, err)
		var b strings.Builder
		require.NoError(t, template.Must(template.New(name).Parse(string(src))).Execute(&b, vars))
		return b.String()
	}
	return &v010{t: t, pool: pool, schema: render("schema.sql"), acquire: render("acquire.sql"), complete: render("complete.sql")}
}

// take acquires key for owner as 0.1.0 does, and returns the token,
// failing the test unless it acquired.
func (o *v010) take(key, owner string) int64 {
	o.t.Helper()
	var state int16
	var rowOwner string
	var token int64
	err := o.pool.QueryRow(context.Background(), o.acquire, []byte(key), owner, int64(time.Minute/time.Microsecond), int64(time.Hour/time.Microsecond), nil).
		Scan(&state, &rowOwner, &token, nil, nil, nil, nil, nil, nil, nil)
	require.NoError(o.t, err)
	require.Equal(o.t, owner, rowOwner, "0.1.0 acquired %s", key)
	return token
}

// state returns what 0.1.0's Acquire of key by owner finds: 1 (taken or
// in progress) or 3 (completed), and whose lease it is.
func (o *v010) state(key, owner string) (int16, string) {
	o.t.Helper()
	var state int16
	var rowOwner string
	err := o.pool.QueryRow(context.Background(), o.acquire, []byte(key), owner, int64(time.Minute/time.Microsecond), int64(time.Hour/time.Microsecond), nil).
		Scan(&state, &rowOwner, nil, nil, nil, nil, nil, nil, nil, nil)
	require.NoError(o.t, err)
	return state, rowOwner
}

// A table of 0.1.0 gets this version's columns from Migrate while
// instances of 0.1.0 keep using it, and neither waits for the other: a
// transaction holds the table (a handler's, around CompleteTx), and
// while Migrate waits for the table's lock 0.1.0's Acquire still runs,
// where an ALTER TABLE queued for the lock would hold up every call
// behind it until that transaction ends. The records 0.1.0 wrote are read
// with no origin and no acquisition time; an acquisition by 0.1.0 leaves
// those of the lease before it (docs/upgrading.md). The 30 s bounds only
// end the test if a call waits.
func TestUpgradeFrom010(t *testing.T) {
	pool := testserver.PostgresPool(t)
	base := newStore(t, pool, pgstore.Options{}) // a schema of its own, dropped at the end
	opts := base.Options()
	opts.Table = "from_010"
	old := newV010(t, pool, opts)
	ctx := context.Background()
	_, err := pool.Exec(ctx, old.schema)
	require.NoError(t, err)
	tbl := pgx.Identifier{opts.Schema, opts.Table}.Sanitize()

	token := old.take("done", "old-a")
	tag, err := pool.Exec(ctx, old.complete, []byte("done"), "old-a", token, []byte("out"))
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	old.take("held", "old-b")

	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer blocker.Rollback(ctx) //nolint:errcheck
	_, err = blocker.Exec(ctx, `LOCK TABLE `+tbl+` IN ROW EXCLUSIVE MODE`)
	require.NoError(t, err)

	s, err := pgstore.New(pool, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	migrated := make(chan error, 1)
	go func() { migrated <- s.Migrate(ctx) }()

	// Once Migrate has waited for the table's lock, 0.1.0's calls run
	// while it keeps trying.
	waited := func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE relation = to_regclass($1) AND NOT granted`, tbl).Scan(&n))
		return n > 0
	}
	require.Eventually(t, waited, 30*time.Second, time.Millisecond, "Migrate waits for the table's lock")
	for i := range 5 {
		bounded, cancel := context.WithTimeout(ctx, 30*time.Second)
		var state int16
		err := pool.QueryRow(bounded, old.acquire, []byte("during-"+string(rune('a'+i))), "old-c", int64(60e6), int64(3600e6), nil).
			Scan(&state, nil, nil, nil, nil, nil, nil, nil, nil, nil)
		cancel()
		require.NoError(t, err, "0.1.0's Acquire %d while Migrate waits for the table", i)
	}
	select {
	case err := <-migrated:
		t.Fatalf("Migrate returned while a transaction held the table: %v", err)
	default:
	}
	require.NoError(t, blocker.Rollback(ctx))
	require.NoError(t, <-migrated)
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
	require.Equal(t, backends.Counts{InProgress: 6, Completed: 1}, c, "no oldest lease in progress: 0.1.0 kept no time")

	res, err := s.Acquire(ctx, backends.AcquireRequest{Key: "new", Owner: "new-a", LeaseTTL: time.Minute, Retention: time.Hour, Origin: "message_uuid=a handler=h"})
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, res.Status)
	rec, err = s.Inspect(ctx, "new")
	require.NoError(t, err)
	require.Equal(t, "message_uuid=a handler=h", rec.Origin)
	c, err = s.Count(ctx, "")
	require.NoError(t, err)
	require.True(t, rec.AcquiredAt.Equal(c.OldestInProgress), "the oldest lease whose time is known")

	// 0.1.0 finds this version's records as it wrote its own: a completed
	// key completed, a lease held by another owner held.
	require.NoError(t, s.Complete(ctx, res.Lease, nil))
	st, _ := old.state("new", "old-d")
	require.EqualValues(t, 3, st, "0.1.0 drops a duplicate of a key this version completed")
	res, err = s.Acquire(ctx, backends.AcquireRequest{Key: "mixed", Owner: "new-b", LeaseTTL: time.Minute, Retention: time.Hour, Origin: "message_uuid=b handler=h"})
	require.NoError(t, err)
	st, owner := old.state("mixed", "old-e")
	require.Equal(t, [2]any{int16(1), "new-b"}, [2]any{st, owner}, "in progress for 0.1.0")
	first, err := s.Inspect(ctx, "mixed")
	require.NoError(t, err)

	// A lease 0.1.0 takes keeps the origin and time of the lease before.
	require.NoError(t, s.Release(ctx, res.Lease))
	old.take("mixed", "old-e")
	rec, err = s.Inspect(ctx, "mixed")
	require.NoError(t, err)
	require.Equal(t, "old-e", rec.Owner)
	require.Equal(t, "message_uuid=b handler=h", rec.Origin, "the origin of the lease before")
	require.True(t, first.AcquiredAt.Equal(rec.AcquiredAt), "the time of the lease before")
}
