package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/benchmarks/internal/load"
)

// perCallCalls is how many calls of each kind one round of perCall makes.
const perCallCalls = 5000

// perCall measures the server CPU of each kind of store call on its own:
// one connection (so the batcher sends every call alone), the backend's
// own CPU time from /proc, each kind of call perCallCalls times a round,
// in the order a key lives them: an Acquire of a fresh key, its
// Complete, then an Acquire of the completed key by another owner (a
// duplicate). Beside them, the floor of a fresh key: a bare INSERT ... ON
// CONFLICT DO NOTHING of the same row into the same table; and the two
// statements of e2ebench's hand-written lease (pg-insert), on a table
// like its own (a text key, a flag, an expiry; no other index): its claim
// of a fresh key and its completion. It returns the median per call of
// each, in the order of perCallKinds.
func perCall(ctx context.Context, url string, store *pgstore.Store, rounds int) ([]time.Duration, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	opts := store.Options()
	opts.Wake = pgstore.WakePoll // no listener: the one connection runs every call
	s, err := pgstore.New(pool, opts)
	if err != nil {
		return nil, err
	}
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return nil, err
	}
	backendCPU := func() (time.Duration, error) {
		f, err := procStat(backend)
		if err != nil {
			return 0, fmt.Errorf("the server's processes are not visible from here: %w", err)
		}
		return time.Duration(ticks(f, 11, 12)) * clockTick, nil
	}
	insert := `INSERT INTO ` + pgx.Identifier{opts.Schema, opts.Table}.Sanitize() + `
		(key, state, owner, token, attempt, lease_expires_at, retention_us, forget_at)
		VALUES ($1, 1, $2, 1, 1, now() + interval '30 seconds', 3600000000, now() + interval '1 hour')
		ON CONFLICT (key) DO NOTHING`
	peer := pgx.Identifier{opts.Schema, opts.Table + "_peer"}.Sanitize()
	unlogged := ""
	if opts.Unlogged {
		unlogged = "UNLOGGED"
	}
	if _, err := pool.Exec(ctx, `CREATE `+unlogged+` TABLE `+peer+` (key text PRIMARY KEY, done boolean NOT NULL DEFAULT false, expires_at timestamptz NOT NULL)`); err != nil {
		return nil, err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS `+peer) //nolint:errcheck // the schema is dropped at the end anyway
	peerClaim := `INSERT INTO ` + peer + ` (key, expires_at) VALUES ($1, now() + $2::interval) ON CONFLICT (key) DO NOTHING`
	peerFinish := `UPDATE ` + peer + ` SET done = true, expires_at = now() + $2::interval WHERE key = $1`
	return load.PerCall(rounds, perCallCalls, perCallKinds, backendCPU, func(keys []string) []func(i int) error {
		return append(load.StoreCalls(ctx, s, keys),
			func(i int) error {
				_, err := pool.Exec(ctx, insert, []byte(keys[i]+"-bare"), "holder")
				return err
			},
			func(i int) error {
				_, err := pool.Exec(ctx, peerClaim, keys[i], 30*time.Second)
				return err
			},
			func(i int) error {
				_, err := pool.Exec(ctx, peerFinish, keys[i], time.Hour)
				return err
			},
		)
	})
}

// perCallKinds names perCall's measurements, in its order.
var perCallKinds = []string{
	"Acquire, fresh key",
	"Complete",
	"Acquire, completed key (a duplicate)",
	"bare INSERT ... ON CONFLICT DO NOTHING, fresh key",
	"pg-insert's claim (INSERT ... ON CONFLICT DO NOTHING, its own table), fresh key",
	"pg-insert's completion (UPDATE ... SET done = true)",
}

// printPerCall prints perCall's medians for each table kind.
func printPerCall(out io.Writer, names []string, medians [][]time.Duration, rounds int) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\nServer CPU per call, one connection, each call alone, %d calls of each a round, median of %d rounds\n\n", perCallCalls, rounds)
	fmt.Fprint(w, "call\t")
	for _, n := range names {
		fmt.Fprint(w, n+"\t")
	}
	fmt.Fprintln(w)
	for k, kind := range perCallKinds {
		fmt.Fprint(w, kind+"\t")
		for i := range names {
			fmt.Fprint(w, micros(medians[i][k])+"\t")
		}
		fmt.Fprintln(w)
	}
	return w.Flush()
}
