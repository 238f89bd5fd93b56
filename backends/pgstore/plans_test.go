package pgstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

// A table analyzed while empty (a fresh deployment, or a cleanup that
// removed every row) has statistics that make a sequential scan look
// cheapest. pgx prepares the store's statements, and from the sixth
// execution on a connection Postgres runs a generic plan, made once and
// kept: made while the table was small, it would stay a sequential scan
// however large the table grows. Every statement that finds a record by
// its key must keep to the primary key: the test loads thousands of keys
// after an ANALYZE of the empty table, then asks each connection for the
// plan of each of the store's prepared statements, as the connection
// runs it.
func TestPlansAfterEmptyTableAnalyzed(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
	require.NoError(t, err)
	cfg.MaxConns = 2 // one for the listener, one that runs every other statement
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := newStore(t, pool, pgstore.Options{})
	table := `"` + store.Options().Schema + `"."` + store.Options().Table + `"`
	_, err = pool.Exec(ctx, `ANALYZE `+table)
	require.NoError(t, err)
	var tuples float64
	require.NoError(t, pool.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE oid = $1::regclass`, table).Scan(&tuples))
	require.Zero(t, tuples, "the table analyzed empty")

	lease := func(key, owner string) backends.Lease {
		res, err := store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: time.Minute, Retention: time.Hour})
		require.NoError(t, err)
		require.Equal(t, backends.StatusAcquired, res.Status)
		return res.Lease
	}
	// The first Watch takes the listener's connection out of the pool:
	// before the load, so that the connection the statements are
	// prepared on stays in it.
	held := lease("plans-watched", "holder")
	watch := func() {
		_, stop, ok := store.Watch(ctx, held.Key)
		require.True(t, ok)
		stop()
	}
	watch()
	const keys = 3000
	for i := range keys {

		key := fmt.Sprintf("plans-%d", i)
		l := lease(key, "holder")
		switch i % 3 {
		case 0:
			require.NoError(t, store.Release(ctx, l))
		default:
			require.NoError(t, store.Renew(ctx, l, time.Minute))
			require.NoError(t, store.Complete(ctx, l, nil))
		}
		// A duplicate of a completed key: the acquire function's read of a
		// record it cannot take, most while the table holds a few rows.
		if i%300 == 1 || (i < 20 && i%3 != 0) {
			res, err := store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: "other", LeaseTTL: time.Minute, Retention: time.Hour})
			require.NoError(t, err)
			require.Equal(t, backends.StatusCompleted, res.Status)
			_, err = store.Inspect(ctx, key)
			require.NoError(t, err)
		}
	}
	for i := range 10 {
		watch()
		require.NoError(t, store.Delete(ctx, fmt.Sprintf("plans-%d", i)))
	}

	// Each statement the store prepared on the table, with the plan the
	// connection runs it with. A generic plan is shown whatever the
	// parameters; EXPLAIN without ANALYZE runs nothing.
	conns := pool.AcquireAllIdle(ctx)
	require.NotEmpty(t, conns)
	seen := map[string]bool{}
	for _, c := range conns {
		defer c.Release()
		rows, err := c.Query(ctx, `SELECT name, statement, generic_plans, cardinality(parameter_types) FROM pg_prepared_statements WHERE statement LIKE '%' || $1 || '%'`, table)
		require.NoError(t, err)
		type prepared struct {
			name, sql      string
			generic, nargs int
		}
		var stmts []prepared
		for rows.Next() {
			var p prepared
			require.NoError(t, rows.Scan(&p.name, &p.sql, &p.generic, &p.nargs))
			stmts = append(stmts, p)
		}
		require.NoError(t, rows.Err())
		for _, p := range stmts {
			op := statementName(p.sql)
			if op == "" {
				continue // Migrate's catalog look
			}
			seen[op] = true
			require.Positive(t, p.generic, "%s runs a generic plan by now", op)
			nulls := strings.TrimSuffix(strings.Repeat("NULL, ", p.nargs), ", ")
			plan := explain(t, c, `EXPLAIN EXECUTE `+p.name+`(`+nulls+`)`)
			require.Contains(t, plan, "Index Scan using "+store.Options().Table+"_pkey", "%s:\n%s", op, plan)
			require.NotContains(t, plan, "Seq Scan", "%s:\n%s", op, plan)
			require.NotContains(t, plan, store.Options().Table+"_fa", "%s:\n%s", op, plan)
		}

		// Acquire calls a function, whose statements EXPLAIN does not
		// reach: the scans they make are counted instead, in a
		// transaction, on each path that reads the key's record.
		tx, err := c.Begin(ctx)
		require.NoError(t, err)
		acquire := pgstore.AcquireFunction(store)
		for _, key := range []string{
			"plans-13",      // completed: only read
			held.Key,        // another owner's lease: only read
			"plans-12",      // released: read, then the upsert
			"plans-1000000", // fresh: the insert alone
		} {
			rows, err := tx.Query(ctx, `SELECT * FROM `+acquire+`($1, $2, $3, $4, NULL, NULL)`, []byte(key), "other", int64(60e6), int64(3600e6))
			require.NoError(t, err)
			rows.Close()
			require.NoError(t, rows.Err())
		}
		var seq, idx int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relid = $1::regclass`, table).Scan(&seq, &idx))
		require.NoError(t, tx.Rollback(ctx))
		require.Zero(t, seq, "the acquire function scanned the table")
		require.GreaterOrEqual(t, idx, int64(3), "the acquire function's reads are index scans")
	}
	for _, op := range []string{"renew", "complete", "release", "inspect", "watch", "delete"} {
		require.True(t, seen[op], "no prepared statement of %s found among %v", op, seen)
	}
}

// statementName names the store's statement sql, or returns "" for one
// that is not found by its key.
func statementName(sql string) string {
	switch {
	case strings.Contains(sql, "SET waited = true"):
		return "watch"
	case strings.Contains(sql, "SET lease_expires_at"):
		return "renew"
	case strings.Contains(sql, "SET state = 3"):
		return "complete"
	case strings.Contains(sql, "SET state = 2"):
		return "release"
	case strings.Contains(sql, "DELETE FROM") && strings.Contains(sql, "WHERE key = $1"):
		return "delete"
	case strings.HasPrefix(sql, "SELECT key,") && strings.Contains(sql, "WHERE key = $1"):
		return "inspect"
	}
	return ""
}

func explain(t *testing.T, c *pgxpool.Conn, sql string) string {
	t.Helper()
	rows, err := c.Query(context.Background(), sql)
	require.NoError(t, err)
	var b strings.Builder
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		b.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	return b.String()
}
