package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
)

// A table analyzed while empty (a fresh deployment, or a cleanup that
// removed every row) must not lead the optimizer away from the primary
// key once the table has grown: after ANALYZE TABLE of the empty table
// and thousands of keys through the store, EXPLAIN of each statement that
// finds a record by its key, with the arguments the store binds, is a
// lookup of one row by the primary key.
func TestPlansAfterEmptyTableAnalyzed(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, 4, nil)
	store := newStore(t, db, mysqlstore.Options{})
	table := "`" + store.Options().Table + "`"
	analyze(t, db, table)

	const keys = 3000
	var last backends.Lease
	for i := range keys {
		res, err := store.Acquire(ctx, backends.AcquireRequest{Key: fmt.Sprintf("plans-%d", i), Owner: "holder", LeaseTTL: time.Minute, Retention: time.Hour})
		require.NoError(t, err)
		require.Equal(t, backends.StatusAcquired, res.Status)
		last = res.Lease
		if i < keys-1 {
			require.NoError(t, store.Complete(ctx, res.Lease, nil))
		}
	}
	// The plans the statements get now, and after the statistics are
	// taken again on the full table: the same, both an index lookup.
	for _, when := range []string{"analyzed empty", "analyzed full"} {
		if when == "analyzed full" {
			analyze(t, db, table)
		}
		for name, query := range mysqlstore.KeyStatements(store) {
			args := []any{[]byte(last.Key), []byte(last.Owner), last.Token}
			switch name {
			case "renew":
				args = append([]any{int64(1), int64(1)}, args...)
			case "complete":
				args = append([]any{nil}, args...)
			}
			args = args[:strings.Count(query, "?")]
			plan := explain(t, db, query, args)
			require.Len(t, plan, 1, "%s, %s: %v", when, name, plan)
			require.Equal(t, "PRIMARY", plan[0]["key"], "%s, %s: %v", when, name, plan)
			require.Contains(t, []string{"const", "range", "eq_ref", "ref"}, plan[0]["type"], "%s, %s: %v", when, name, plan)
			require.Equal(t, "1", plan[0]["rows"], "%s, %s: %v", when, name, plan)
		}
		// Completions sent together: a lookup of each of their rows.
		leases := []backends.Lease{last, {Key: "plans-7", Owner: "holder", Token: 1}, {Key: "plans-2999x", Owner: "holder", Token: 1}}
		query, args := mysqlstore.CompleteTogether(store, leases)
		plan := explain(t, db, query, args)
		require.Len(t, plan, 1, "%s, complete together: %v", when, plan)
		require.Equal(t, "PRIMARY", plan[0]["key"], "%s, complete together: %v", when, plan)
		require.Equal(t, "range", plan[0]["type"], "%s, complete together: %v", when, plan)
		rows, err := strconv.Atoi(plan[0]["rows"])
		require.NoError(t, err)
		require.LessOrEqual(t, rows, len(leases), "%s, complete together: %v", when, plan)
	}
}

func analyze(t *testing.T, db *sql.DB, table string) {
	t.Helper()
	rows, err := db.Query("ANALYZE TABLE " + table)
	require.NoError(t, err)
	require.NoError(t, rows.Close())
}

// explain returns the rows of EXPLAIN of query with args, each a map of
// column to value.
func explain(t *testing.T, db *sql.DB, query string, args []any) []map[string]string {
	t.Helper()
	rows, err := db.Query("EXPLAIN "+query, args...)
	require.NoError(t, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	var plan []map[string]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		dest := make([]any, len(cols))
		for i := range vals {
			dest[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(dest...))
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		plan = append(plan, row)
	}
	require.NoError(t, rows.Err())
	return plan
}
