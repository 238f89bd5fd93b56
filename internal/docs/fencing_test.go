package docs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

// The fenced write documented in docs/concepts.md, run as written against
// Postgres: effects are compared per idempotency key, so a second order on
// the same account is applied; a holder that was overtaken is refused;
// the same holder writing again (a retry within its lease) is not.
func TestFencedWriteAsDocumented(t *testing.T) {
	ctx := context.Background()
	table, err := region("internal/docs/fencing.sql", "table")
	require.NoError(t, err)
	write, err := region("internal/docs/fencing.sql", "write")
	require.NoError(t, err)

	conn, err := pgx.Connect(ctx, testserver.PostgresURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	schema := fmt.Sprintf("docs_fencing_%d", time.Now().UnixNano())
	_, err = conn.Exec(ctx, "CREATE SCHEMA "+schema+"; SET search_path TO "+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	_, err = conn.Exec(ctx, table)
	require.NoError(t, err)

	apply := func(key string, token, amount int64) bool {
		t.Helper()
		tag, err := conn.Exec(ctx, write, key, token, amount)
		require.NoError(t, err)
		return tag.RowsAffected() == 1
	}
	require.True(t, apply("charge:order-1", 1, 100), "the first holder of order-1")
	require.True(t, apply("charge:order-2", 1, 50), "a second order on the same account: its own key, token 1 again")
	require.True(t, apply("charge:order-1", 2, 100), "a holder that took order-1 over")
	require.False(t, apply("charge:order-1", 1, 999), "the overtaken holder's late write is refused")
	require.True(t, apply("charge:order-1", 2, 100), "the same holder writing again, within its lease")

	var token, amount int64
	require.NoError(t, conn.QueryRow(ctx, "SELECT token, amount FROM effects WHERE key = 'charge:order-1'").Scan(&token, &amount))
	require.Equal(t, int64(2), token)
	require.Equal(t, int64(100), amount)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM effects").Scan(&n))
	require.Equal(t, 2, n, "one effect per key")
}
