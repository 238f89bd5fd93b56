package pgstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	"github.com/watermill-idempotency/idempotency/storetest"
)

// smallPool connects to the test database with at most maxConns connections.
func smallPool(t testing.TB, maxConns int) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
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
// (storetest.Storm.Run).
func TestStormPostgres(t *testing.T) {
	opts := newStore(t, testserver.PostgresPool(t), pgstore.Options{}).Options()
	storetest.Storm{
		Instances: 8, Keys: 2000, Copies: 3,
		Store: func(t testing.TB, _ int) backends.Store {
			s, err := pgstore.New(smallPool(t, 8), opts)
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
	}.Run(t)
}

// newTable creates a business table in Postgres that checks fencing
// tokens (storetest.Table) in schema.
func newTable(t *testing.T, p *pgxpool.Pool, schema string) (*storetest.Table, string) {
	name := schema + ".effects"
	_, err := p.Exec(context.Background(), `CREATE TABLE `+name+` (key text PRIMARY KEY, token bigint NOT NULL, applied int NOT NULL)`)
	require.NoError(t, err)
	return &storetest.Table{Read: func(key string) (map[string]int, error) {
		rows, err := p.Query(context.Background(), `SELECT key, applied FROM `+name+` WHERE $1 = '' OR key = $1`, key)
		if err != nil {
			return nil, err
		}
		out := map[string]int{}
		var k string
		var applied int
		_, err = pgx.ForEachRow(rows, []any{&k, &applied}, func() error {
			out[k] = applied
			return nil
		})
		return out, err
	}}, name
}

// Exactly-once effects under a storm (storetest.TxStorm), each instance with
// its own store pool and business pool of 4 connections: each handler
// writes its key's effect and completes the key in one transaction
// (CompleteTx); the write refuses a stale token.
func TestTxStormExactlyOnceEffects(t *testing.T) {
	base := testserver.PostgresPool(t)
	opts := newStore(t, base, pgstore.Options{}).Options()
	table, name := newTable(t, base, opts.Schema)
	storetest.TxStorm{
		Table: table,
		Store: func(t testing.TB, _ int) backends.Store {
			s, err := pgstore.New(smallPool(t, 4), opts)
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Begin: func(t testing.TB, _ int) func(context.Context, backends.Lease) (func() error, func(), error) {
			business := smallPool(t, 4)
			store, err := pgstore.New(business, opts)
			require.NoError(t, err)
			return func(ctx context.Context, lease backends.Lease) (func() error, func(), error) {
				tx, err := business.Begin(ctx)
				if err != nil {
					return nil, nil, err
				}
				rollback := func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }
				tag, err := tx.Exec(ctx, `INSERT INTO `+name+` AS e (key, token, applied) VALUES ($1, $2, 1)
					ON CONFLICT (key) DO UPDATE SET token = excluded.token, applied = e.applied + 1 WHERE e.token < excluded.token`,
					lease.Key, lease.Token)
				if err == nil && tag.RowsAffected() == 0 {
					err = table.Refused(lease)
				}
				if err == nil {
					err = store.CompleteTx(ctx, tx, lease, nil)
				}
				if err != nil {
					rollback()
					return nil, nil, err
				}
				return func() error { return tx.Commit(ctx) }, rollback, nil
			}
		},
	}.Run(t)
}

// A table that does not exist (Migrate never ran) is an error retrying
// cannot fix: the store marks it, and the middleware fails the delivery
// after one call instead of retrying until Timing.StoreTimeout. Acquire
// finds the table's function missing (42883), or its schema (3F000).
func TestMissingTableIsRejected(t *testing.T) {
	for schema, code := range map[string]string{"public": "42883", "pgstore_never_migrated": "3F000"} {
		t.Run(schema, func(t *testing.T) {
			s, err := pgstore.New(testserver.PostgresPool(t), pgstore.Options{Schema: schema, Table: "never_migrated"})
			require.NoError(t, err)
			storetest.CheckRejected(t, s, code)
		})
	}
}
