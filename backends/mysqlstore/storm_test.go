package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/storetest"
)

// The acquisition race of every store (storetest.Race): 32 goroutines, each
// with its own connection pool, on 4 keys.
func TestAcquireRace32(t *testing.T) {
	t.Parallel()
	opts := newStore(t, openDB(t, 2, nil), mysqlstore.Options{}).Options()
	storetest.Race{Racers: 32, Keys: 4, Wins: 120, LeaseTTL: time.Second,
		Store: func(t testing.TB, _ int) backends.Store {
			s, err := mysqlstore.New(openDB(t, 2, nil), opts)
			require.NoError(t, err)
			return s
		}}.Run(t)
}

// The storm of the other stores, on MariaDB: eight instances, each with
// its own pool of 8 connections, three copies of each of 2,000 keys at
// once, the default configuration, effects through a fenced sink.
func TestStormMariaDB(t *testing.T) {
	t.Parallel()
	opts := newStore(t, openDB(t, 2, nil), mysqlstore.Options{}).Options()
	storetest.Storm{
		Instances: 8, Keys: 2000, Copies: 3,
		Store: func(t testing.TB, _ int) backends.Store {
			s, err := mysqlstore.New(openDB(t, 8, nil), opts)
			require.NoError(t, err)
			return s
		},
	}.Run(t)
}

// newTable creates a business table in MariaDB that checks fencing
// tokens (storetest.Table).
func newTable(t *testing.T, db *sql.DB) (*storetest.Table, string) {
	name := fmt.Sprintf("effects_%d", time.Now().UnixNano()%1e9)
	_, err := db.Exec("CREATE TABLE `" + name + "` (`key` VARBINARY(255) PRIMARY KEY, token BIGINT NOT NULL, applied INT NOT NULL) ENGINE = InnoDB")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + name + "`") })
	return &storetest.Table{Read: func(key string) (map[string]int, error) {
		rows, err := db.Query("SELECT `key`, applied FROM `"+name+"` WHERE ? = '' OR `key` = ?", []byte(key), []byte(key))
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var k []byte
			var applied int
			if err := rows.Scan(&k, &applied); err != nil {
				return nil, err
			}
			out[string(k)] = applied
		}
		return out, rows.Err()
	}}, name
}

// Exactly-once effects under a storm (storetest.TxStorm), each instance with
// its own store pool and business pool of 4 connections: each handler
// writes its key's effect and completes the key in one transaction
// (CompleteTx); the write refuses a stale token. applied is assigned
// before token: ON DUPLICATE KEY UPDATE runs left to right.
func TestTxStormExactlyOnceEffects(t *testing.T) {
	t.Parallel()
	base := openDB(t, 4, nil)
	opts := newStore(t, base, mysqlstore.Options{}).Options()
	table, name := newTable(t, base)
	storetest.TxStorm{
		Table: table,
		Store: func(t testing.TB, _ int) backends.Store {
			s, err := mysqlstore.New(openDB(t, 4, nil), opts)
			require.NoError(t, err)
			return s
		},
		Begin: func(t testing.TB, _ int) func(context.Context, backends.Lease) (func() error, func(), error) {
			business := openDB(t, 4, nil)
			store, err := mysqlstore.New(business, opts)
			require.NoError(t, err)
			return func(ctx context.Context, lease backends.Lease) (func() error, func(), error) {
				tx, err := business.BeginTx(ctx, nil)
				if err != nil {
					return nil, nil, err
				}
				rollback := func() { _ = tx.Rollback() }
				res, err := tx.ExecContext(ctx, "INSERT INTO `"+name+"` (`key`, token, applied) VALUES (?, ?, 1)"+
					" ON DUPLICATE KEY UPDATE applied = IF(token < ?, applied + 1, applied), token = GREATEST(token, ?)",
					[]byte(lease.Key), lease.Token, lease.Token, lease.Token)
				if err == nil {
					if n, rerr := res.RowsAffected(); rerr != nil || n == 0 {
						err = errors.Join(table.Refused(lease), rerr)
					}
				}
				if err == nil {
					err = store.CompleteTx(ctx, tx, lease, nil)
				}
				if err != nil {
					rollback()
					return nil, nil, err
				}
				return tx.Commit, rollback, nil
			}
		},
	}.Run(t)
}

// A table that does not exist (Migrate never ran) is an error retrying
// cannot fix: the store marks it, and the middleware fails the delivery
// after one call instead of retrying until Timing.StoreTimeout.
func TestMissingTableIsRejected(t *testing.T) {
	t.Parallel()
	s, err := mysqlstore.New(openDB(t, 2, nil), mysqlstore.Options{Table: "never_migrated"})
	require.NoError(t, err)
	storetest.CheckRejected(t, s, "1146")
}

func TestCleanup(t *testing.T) {
	t.Parallel()
	db := openDB(t, 4, nil)
	s := newStore(t, db, mysqlstore.Options{})
	storetest.CheckCleanup(t, s, func() (n int) {
		require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM `"+s.Options().Table+"`").Scan(&n))
		return n
	})
}
