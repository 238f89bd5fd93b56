package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// MySQL refuses lock names over 64 characters; a qualified table name
// can have 129.
func TestMigrateLockNameFits(t *testing.T) {
	t.Parallel()
	longest := strings.Repeat("d", 64) + "." + strings.Repeat("t", 64)
	name := migrateLock(longest)
	require.LessOrEqual(t, len(name), 64)
	require.True(t, strings.HasPrefix(name, "mysqlstore:migrate:"), name)
	require.Equal(t, name, migrateLock(longest), "the same table, the same lock")
	require.NotEqual(t, name, migrateLock(longest[:len(longest)-1]+"u"))
	require.NotEqual(t, migrateLock("a.b"), migrateLock("b.b"), "the database is part of the name")
}

// While another session holds the migration lock, Migrate waits no longer
// than ctx allows and says what it waited for; a store naming the table
// with its database waits for the same lock.
func TestMigrateLockHeldElsewhere(t *testing.T) {
	t.Parallel()
	dsn := os.Getenv("MYSQL_DSN")
	if dsn == "" {
		t.Fatal("MYSQL_DSN is not set: run the tests with `make test`")
	}
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	table := fmt.Sprintf("idem_locked_%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`") })
	var database string
	require.NoError(t, db.QueryRow("SELECT DATABASE()").Scan(&database))

	holder, err := db.Conn(context.Background())
	require.NoError(t, err)
	defer holder.Close()
	var got int
	require.NoError(t, holder.QueryRowContext(context.Background(), "SELECT GET_LOCK(?, 0)", migrateLock(database+"."+table)).Scan(&got))
	require.Equal(t, 1, got)

	for _, name := range []string{table, database + "." + table} {
		s, err := New(db, Options{Table: name})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		err = s.Migrate(ctx)
		cancel()
		require.ErrorContains(t, err, "not taken within 1s: GET_LOCK returned 0", name)
		require.NotContains(t, err.Error(), "%!", name)
	}

	_, err = holder.ExecContext(context.Background(), "DO RELEASE_LOCK(?)", migrateLock(database+"."+table))
	require.NoError(t, err)
	s, err := New(db, Options{Table: table})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
}
