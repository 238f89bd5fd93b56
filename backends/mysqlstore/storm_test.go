package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/internal/fleet"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// The acquisition race of every store (fleet.Race): 32 goroutines, each
// with its own connection pool, on 4 keys.
func TestAcquireRace32(t *testing.T) {
	t.Parallel()
	opts := newStore(t, openDB(t, 2, nil), mysqlstore.Options{}).Options()
	fleet.Race{Racers: 32, Keys: 4, Wins: 120, LeaseTTL: time.Second,
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
	fleet.Storm{
		Instances: 8, Keys: 2000, Copies: 3,
		Store: func(t testing.TB, _ int) backends.Store {
			s, err := mysqlstore.New(openDB(t, 8, nil), opts)
			require.NoError(t, err)
			return s
		},
	}.Run(t).Check(t)
}

// effects is a business table in MariaDB that checks fencing tokens: one
// row per key, written only by a token higher than the row's, with a
// count of the writes it accepted. The handler writes it in the same
// transaction as the key's completion (mysqlstore.Store.CompleteTx).
type effects struct {
	db    *sql.DB
	table string

	mu        sync.Mutex
	committed map[string]map[int64]bool // key -> tokens whose transaction committed
	refused   atomic.Int64
}

var _ fleet.Effects = (*effects)(nil)

func newEffects(t *testing.T, db *sql.DB) *effects {
	e := &effects{db: db, table: fmt.Sprintf("effects_%d", time.Now().UnixNano()%1e9), committed: map[string]map[int64]bool{}}
	_, err := db.Exec("CREATE TABLE `" + e.table + "` (`key` VARBINARY(255) PRIMARY KEY, token BIGINT NOT NULL, applied INT NOT NULL) ENGINE = InnoDB")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + e.table + "`") })
	return e
}

// apply writes key's effect under lease in tx, refusing a stale token.
// applied is assigned before token: ON DUPLICATE KEY UPDATE runs left to
// right.
func (e *effects) apply(ctx context.Context, tx *sql.Tx, lease backends.Lease) error {
	res, err := tx.ExecContext(ctx, "INSERT INTO `"+e.table+"` (`key`, token, applied) VALUES (?, ?, 1)"+
		" ON DUPLICATE KEY UPDATE applied = IF(token < ?, applied + 1, applied), token = GREATEST(token, ?)",
		[]byte(lease.Key), lease.Token, lease.Token, lease.Token)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		e.refused.Add(1)
		return fmt.Errorf("%w: key %q token %d", fleet.ErrStale, lease.Key, lease.Token)
	}
	return nil
}

func (e *effects) markCommitted(key string, token int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.committed[key] == nil {
		e.committed[key] = map[int64]bool{}
	}
	e.committed[key][token] = true
}

func (e *effects) Applied(key string) (bool, error) {
	var n int
	err := e.db.QueryRow("SELECT COALESCE(MAX(applied), 0) FROM `"+e.table+"` WHERE `key` = ?", []byte(key)).Scan(&n)
	return n > 0, err
}

func (e *effects) Tally() (map[string]fleet.Tally, int64, error) {
	rows, err := e.db.Query("SELECT `key`, applied FROM `" + e.table + "`")
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	out := map[string]fleet.Tally{}
	for rows.Next() {
		var key []byte
		var applied int
		if err := rows.Scan(&key, &applied); err != nil {
			return nil, 0, err
		}
		out[string(key)] = fleet.Tally{Applied: applied}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for key, tokens := range e.committed {
		t := out[key]
		t.Holders = len(tokens)
		out[key] = t
	}
	return out, e.refused.Load(), nil
}

// losesReturn reports whether key's first committed attempt then loses
// its return, as a process dying between commit and ack would.
func losesReturn(key string) bool {
	h := fnv.New32a()
	h.Write([]byte(key))
	return h.Sum32()%3 == 1
}

// Exactly-once effects under a storm: eight instances, each with its own
// store pool and business pool of 4 connections and four workers, three
// copies of each of 2,000 keys at once. Each handler writes its key's
// effect and completes the key in one transaction. The first attempt of
// every third key rolls back after writing; the first commit of another
// third of the keys loses its return (the process died before the ack).
// Every key's effect is applied exactly once: business rows equal keys.
func TestTxStormExactlyOnceEffects(t *testing.T) {
	t.Parallel()
	base := openDB(t, 4, nil)
	opts := newStore(t, base, mysqlstore.Options{}).Options()
	fx := newEffects(t, base)
	var rollbacks, lostReturns atomic.Int64
	var lost sync.Map
	report := fleet.Storm{
		Instances: 8, Keys: 2000, Copies: 3, Workers: 4, Effects: fx,
		Store: func(t testing.TB, _ int) backends.Store {
			s, err := mysqlstore.New(openDB(t, 4, nil), opts)
			require.NoError(t, err)
			return s
		},
		Handler: func(int) message.HandlerFunc {
			business := openDB(t, 4, nil)
			store, err := mysqlstore.New(business, opts)
			require.NoError(t, err)
			return func(msg *message.Message) ([]*message.Message, error) {
				ctx := msg.Context()
				lease, _ := idempotency.LeaseFromContext(ctx)
				tx, err := business.BeginTx(ctx, nil)
				if err != nil {
					return nil, err
				}
				defer tx.Rollback() //nolint:errcheck
				if err := fx.apply(ctx, tx, lease); err != nil {
					return nil, err
				}
				if err := store.CompleteTx(ctx, tx, lease, nil); err != nil {
					return nil, err
				}
				if lease.Attempt == 1 && fleet.FailsFirst(lease.Key) {
					rollbacks.Add(1)
					return nil, errors.New("injected rollback")
				}
				if err := tx.Commit(); err != nil {
					return nil, err
				}
				fx.markCommitted(lease.Key, lease.Token)
				if _, loaded := lost.LoadOrStore(lease.Key, true); !loaded && losesReturn(lease.Key) {
					lostReturns.Add(1)
					return nil, errors.New("injected lost return after commit")
				}
				return nil, nil
			}
		},
	}.Run(t)
	report.Check(t)
	require.Positive(t, rollbacks.Load())
	require.Positive(t, lostReturns.Load())
	t.Logf("%d rollbacks and %d lost returns injected", rollbacks.Load(), lostReturns.Load())

	var rows int
	require.NoError(t, base.QueryRow("SELECT COUNT(*) FROM `"+fx.table+"`").Scan(&rows))
	require.Equal(t, 2000, rows, "one business row per key")
}

// A table that does not exist (Migrate never ran) is an error retrying
// cannot fix: the store marks it, and the middleware fails the delivery
// after one call instead of retrying until StoreTimeout.
func TestMissingTableIsRejected(t *testing.T) {
	t.Parallel()
	s, err := mysqlstore.New(openDB(t, 2, nil), mysqlstore.Options{Table: "never_migrated"})
	require.NoError(t, err)
	fleet.CheckRejected(t, s, "1146")
}

func TestCleanup(t *testing.T) {
	t.Parallel()
	db := openDB(t, 4, nil)
	s := newStore(t, db, mysqlstore.Options{})
	fleet.CheckCleanup(t, s, func() (n int) {
		require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM `"+s.Options().Table+"`").Scan(&n))
		return n
	})
}
