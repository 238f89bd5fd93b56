package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/internal/fleet"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// pool connects to the test database with at most maxConns connections.
func pool(t testing.TB, maxConns int) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL())
	require.NoError(t, err)
	cfg.MaxConns = int32(maxConns)
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// The storm of the other stores, on Postgres: eight instances, each with
// its own pool of 8 connections for the store (so acquisitions take at
// most 4 by default), three copies of each of 2,000 keys at once, the
// default configuration, effects through a fenced sink
// (fleet.Report.Check).
func TestStormPostgres(t *testing.T) {
	opts := newStore(t, testserver.PostgresPool(t), pgstore.Options{}).Options()
	fleet.Storm{
		Instances: 8, Keys: 2000, Copies: 3,
		Store: func(t testing.TB, _ int) backends.Store {
			s, err := pgstore.New(pool(t, 8), opts)
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
	}.Run(t).Check(t)
}

// effects is a business table in Postgres that checks fencing tokens:
// one row per key, written only by a token higher than the row's, with a
// count of the writes it accepted. The handler writes it in the same
// transaction as the key's completion (pgstore.Store.CompleteTx).
type effects struct {
	pool  *pgxpool.Pool
	table string

	mu        sync.Mutex
	committed map[string]map[int64]bool // key -> tokens whose transaction committed
	refused   atomic.Int64
}

var _ fleet.Effects = (*effects)(nil)

func newEffects(t *testing.T, p *pgxpool.Pool, schema string) *effects {
	e := &effects{pool: p, table: schema + ".effects", committed: map[string]map[int64]bool{}}
	_, err := p.Exec(context.Background(), `CREATE TABLE `+e.table+` (key text PRIMARY KEY, token bigint NOT NULL, applied int NOT NULL)`)
	require.NoError(t, err)
	return e
}

// apply writes key's effect under lease in tx, refusing a stale token.
func (e *effects) apply(ctx context.Context, tx pgstore.DB, lease backends.Lease) error {
	tag, err := tx.Exec(ctx, `INSERT INTO `+e.table+` AS e (key, token, applied) VALUES ($1, $2, 1)
		ON CONFLICT (key) DO UPDATE SET token = excluded.token, applied = e.applied + 1 WHERE e.token < excluded.token`,
		lease.Key, lease.Token)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
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
	err := e.pool.QueryRow(context.Background(), `SELECT coalesce(max(applied), 0) FROM `+e.table+` WHERE key = $1`, key).Scan(&n)
	return n > 0, err
}

func (e *effects) Tally() (map[string]fleet.Tally, int64, error) {
	rows, err := e.pool.Query(context.Background(), `SELECT key, applied FROM `+e.table)
	if err != nil {
		return nil, 0, err
	}
	out := map[string]fleet.Tally{}
	for rows.Next() {
		var key string
		var applied int
		if err := rows.Scan(&key, &applied); err != nil {
			return nil, 0, err
		}
		out[key] = fleet.Tally{Applied: applied}
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
// store pool and business pool of 4 connections and four workers (a
// broker's consumer count), three copies of each of 2,000 keys at once. Each handler writes
// its key's effect and completes the key in one transaction. The first
// attempt of every third key rolls back after writing; the first commit
// of another third of the keys loses its return (the process died before
// the ack). Every key's effect is applied exactly once.
func TestTxStormExactlyOnceEffects(t *testing.T) {
	base := testserver.PostgresPool(t)
	opts := newStore(t, base, pgstore.Options{}).Options()
	fx := newEffects(t, base, opts.Schema)
	var rollbacks, lostReturns atomic.Int64
	var lost sync.Map
	report := fleet.Storm{
		Instances: 8, Keys: 2000, Copies: 3, Workers: 4, Effects: fx,
		Store: func(t testing.TB, _ int) backends.Store {
			s, err := pgstore.New(pool(t, 4), opts)
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Handler: func(int) message.HandlerFunc {
			business := pool(t, 4)
			store, err := pgstore.New(business, opts)
			require.NoError(t, err)
			return func(msg *message.Message) ([]*message.Message, error) {
				ctx := msg.Context()
				lease, _ := idempotency.LeaseFromContext(ctx)
				tx, err := business.Begin(ctx)
				if err != nil {
					return nil, err
				}
				defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
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
				if err := tx.Commit(ctx); err != nil {
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
	require.NoError(t, base.QueryRow(context.Background(), `SELECT count(*) FROM `+fx.table).Scan(&rows))
	require.Equal(t, 2000, rows, "one business row per key")
}

// A table that does not exist (Migrate never ran) is an error retrying
// cannot fix: the store marks it, and the middleware fails the delivery
// after one call instead of retrying until StoreTimeout.
func TestMissingTableIsRejected(t *testing.T) {
	s, err := pgstore.New(testserver.PostgresPool(t), pgstore.Options{Schema: "pgstore_never_migrated"})
	require.NoError(t, err)
	fleet.CheckRejected(t, s, "42P01")
}
