// Command mysqlbench measures the MySQL store against its own two
// statements, Acquire's upsert with RETURNING and Complete's update, run
// raw through the same driver and pool (database/sql, go-sql-driver/mysql),
// on the same server, at the same concurrency, in one run.
//
//	go run ./mysqlbench -dsn 'root@tcp(127.0.0.1:3306)/test' -clients 16 -duration 5s
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"regexp"
	"text/tabwriter"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/benchmarks/internal/load"
)

func main() {
	dsn := flag.String("dsn", "root@tcp(127.0.0.1:3306)/test", "MySQL or MariaDB DSN")
	clients := flag.Int("clients", 16, "concurrent clients")
	duration := flag.Duration("duration", 5*time.Second, "duration of each run")
	rounds := flag.Int("rounds", 3, "rounds, alternating which goes first; medians are reported")
	flag.Parse()
	if err := run(*dsn, *clients, *duration, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "mysqlbench:", err)
		os.Exit(1)
	}
}

func run(dsn string, clients int, duration time.Duration, rounds int) error {
	ctx := context.Background()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(clients)
	db.SetMaxIdleConns(clients)
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return err
	}
	tables := 0
	// Each measurement gets a fresh table, so neither inherits the
	// other's rows.
	fresh := func() (*mysqlstore.Store, func(), error) {
		tables++
		table := fmt.Sprintf("mysqlbench_%d_%d", time.Now().UnixNano()%1e9, tables)
		store, err := mysqlstore.New(db, mysqlstore.Options{Table: table})
		if err != nil {
			return nil, nil, err
		}
		drop := func() { db.Exec("DROP TABLE IF EXISTS `" + table + "`") } //nolint:errcheck
		return store, drop, store.Migrate(ctx)
	}
	raw := func(store *mysqlstore.Store) func(ctx context.Context, key string) error {
		acquire, complete := store.Statements()
		var names []string
		acquire = regexp.MustCompile(`:[a-z]+`).ReplaceAllStringFunc(acquire, func(p string) string {
			names = append(names, p[1:])
			return "?"
		})
		return func(ctx context.Context, key string) error {
			vals := map[string]any{"key": []byte(key), "owner": []byte(key), "ttl": int64(30e6), "ret": int64(3600e6), "fp": nil}
			args := make([]any, len(names))
			for i, n := range names {
				args[i] = vals[n]
			}
			var state, how int16
			var owner, fp, out []byte
			var token, lease, now int64
			var attempt int32
			var completed sql.NullInt64
			if err := db.QueryRowContext(ctx, acquire, args...).Scan(&state, &owner, &token, &attempt, &how, &lease, &completed, &fp, &out, &now); err != nil {
				return err
			}
			_, err := db.ExecContext(ctx, complete, nil, []byte(key), []byte(key), token)
			return err
		}
	}
	ours := func(store *mysqlstore.Store) func(ctx context.Context, key string) error {
		return load.StoreCycle(store)
	}
	var raws, ourRuns []float64
	measure := func(op func(*mysqlstore.Store) func(context.Context, string) error, into *[]float64) error {
		store, drop, err := fresh()
		defer func() {
			if drop != nil {
				drop()
			}
		}()
		if err != nil {
			return err
		}
		v, err := load.Cycles(clients, duration, op(store))
		*into = append(*into, v)
		return err
	}
	if err := load.Rounds(rounds,
		func() error { return measure(raw, &raws) },
		func() error { return measure(ours, &ourRuns) },
	); err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "MySQL store benchmark on %s: %d clients, %v per run, median of %d rounds\n\n", version, clients, duration, rounds)
	fmt.Fprintln(w, "its two statements, raw\tour Acquire+Complete\tratio\tgoal\t")
	r, o := load.Median(raws), load.Median(ourRuns)
	fmt.Fprintf(w, "%.0f cycles/s\t%.0f cycles/s\t%.3f\t≥ 0.80\t\n", r, o, o/r)
	return w.Flush()
}
