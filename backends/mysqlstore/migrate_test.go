package mysqlstore_test

import (
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

// Instances that start together all migrate the same fresh table, each
// twice: every call succeeds, and the table works; a later migration
// keeps its records.
func TestMigrateConcurrentlyAndTwice(t *testing.T) {
	t.Parallel()
	db := openDB(t, 16, nil)
	table := fmt.Sprintf("idem_migrate_%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`") })

	const instances = 8
	errs := make(chan error, 2*instances)
	var wg sync.WaitGroup
	for range instances {
		wg.Go(func() {
			s, err := mysqlstore.New(db, mysqlstore.Options{Table: table})
			if err != nil {
				errs <- err
				return
			}
			for range 2 {
				errs <- s.Migrate(ctx(t))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	s, err := mysqlstore.New(db, mysqlstore.Options{Table: table})
	require.NoError(t, err)
	l := acquire(t, s, "k", "a", time.Minute).Lease
	require.NoError(t, s.Complete(ctx(t), l, []byte("out")))
	require.NoError(t, s.Migrate(ctx(t)))
	res := acquire(t, s, "k", "b", time.Minute)
	require.Equal(t, backends.StatusCompleted, res.Status, "the record survived the migration")
	require.Equal(t, []byte("out"), res.Output)
}

// Table names of the longest kind, 64 characters, alone and qualified by
// the database: the names derived from it, of the migration lock and of
// the table's index, stay within the server's 64 characters.
func TestMigrateLongTableName(t *testing.T) {
	t.Parallel()
	db := openDB(t, 2, nil)
	cfg, err := mysql.ParseDSN(dsn(t))
	require.NoError(t, err)
	require.NotEmpty(t, cfg.DBName, "MYSQL_DSN names a database")
	stamp := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	for _, table := range []string{
		"idem_long_" + stamp + "_" + strings.Repeat("t", 64-len("idem_long__")-len(stamp)),
		cfg.DBName + ".idem_long_" + stamp + "_" + strings.Repeat("q", 64-len("idem_long__")-len(stamp)),
	} {
		name := table[strings.LastIndexByte(table, '.')+1:]
		require.Len(t, name, 64)
		t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + name + "`") })
		s, err := mysqlstore.New(db, mysqlstore.Options{Table: table})
		require.NoError(t, err)
		require.NoError(t, s.Migrate(ctx(t)), table)
		require.Equal(t, backends.StatusAcquired, acquire(t, s, "k", "a", time.Minute).Status, table)
	}
}
