// Command pgbench measures the Postgres store against pgbench running the
// store's own acquire and complete statements, on the same server, at the
// same concurrency, in one run, for a logged and an UNLOGGED table; then,
// for a server on this machine, the server CPU of each kind of call on
// its own, on one connection, beside a bare insert of the same row.
//
//	go run ./pgbench -url postgres://postgres@127.0.0.1:5432/test -clients 16 -duration 10s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/benchmarks/internal/load"
)

func main() {
	url := flag.String("url", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "database URL")
	clients := flag.Int("clients", 16, "concurrent clients")
	duration := flag.Duration("duration", 5*time.Second, "duration of each run")
	rounds := flag.Int("rounds", 3, "rounds, alternating which goes first; medians are reported")
	flag.Parse()
	if err := run(*url, *clients, *duration, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "pgbench:", err)
		os.Exit(1)
	}
}

type result struct {
	name        string
	limit, ours float64
	// Server CPU per cycle under pgbench and under ours, our client's CPU
	// per cycle (zero where not measured), and one client's median
	// Acquire+Complete.
	limitCPU, oursCPU, clientCPU time.Duration
	lone                         time.Duration
}

// run is one measurement: cycles per second, and CPU per cycle.
type measured struct {
	rate           float64
	server, client time.Duration
	cycles         float64
}

func run(url string, clients int, duration time.Duration, rounds int) error {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(clients)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := fmt.Sprintf("pgbench_idem_%d", time.Now().UnixNano()%1e9)
	defer pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) //nolint:errcheck

	server, err := findServer(ctx, pool)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgbench: server CPU not measured:", err)
	}
	// cpu runs fn, which reports how many cycles it ran, and returns the
	// server's CPU and ours per cycle.
	cpu := func(fn func() (float64, error)) (measured, error) {
		var before time.Duration
		if server.postmaster != 0 {
			if before, err = server.used(); err != nil {
				return measured{}, err
			}
		}
		self := selfCPU()
		start := time.Now()
		rate, err := fn()
		if err != nil {
			return measured{}, err
		}
		m := measured{rate: rate, cycles: rate * time.Since(start).Seconds()}
		m.client = time.Duration(float64(selfCPU()-self) / m.cycles)
		if server.postmaster != 0 {
			after, err := server.used()
			if err != nil {
				return measured{}, err
			}
			m.server = time.Duration(float64(after-before) / m.cycles)
		}
		return m, nil
	}

	var results []result
	tables := 0
	fresh := func(unlogged bool) (*pgstore.Store, error) {
		tables++
		store, err := pgstore.New(pool, pgstore.Options{Schema: schema, Table: fmt.Sprintf("keys_%d", tables), Unlogged: unlogged})
		if err != nil {
			return nil, err
		}
		return store, store.Migrate(ctx)
	}
	var perCallNames []string
	var perCallMedians [][]time.Duration
	for _, unlogged := range []bool{false, true} {
		name := "logged"
		if unlogged {
			name = "UNLOGGED"
		}
		// Each measurement gets a fresh table, and the two alternate which
		// goes first, so neither inherits the other's rows or vacuum work.
		var limits, ourRuns []float64
		var limitCPU, ourCPU, clientCPU, lone []time.Duration
		for round := range rounds {
			steps := []func() error{
				func() error {
					store, err := fresh(unlogged)
					if err != nil {
						return err
					}
					m, err := cpu(func() (float64, error) { return pgbench(url, store, clients, duration) })
					limits, limitCPU = append(limits, m.rate), append(limitCPU, m.server)
					return err
				},
				func() error {
					store, err := fresh(unlogged)
					if err != nil {
						return err
					}
					m, err := cpu(func() (float64, error) { return load.Cycles(clients, duration, load.StoreCycle(store)) })
					if err != nil {
						return err
					}
					ourRuns, ourCPU, clientCPU = append(ourRuns, m.rate), append(ourCPU, m.server), append(clientCPU, m.client)
					l, err := load.Sequential(loneCycles, load.StoreCycle(store))
					lone = append(lone, l)
					return err
				},
			}
			for i := range steps {
				if err := steps[(i+round)%2](); err != nil {
					return err
				}
			}
		}
		if server.postmaster != 0 {
			store, err := fresh(unlogged)
			if err != nil {
				return err
			}
			m, err := perCall(ctx, url, store, rounds)
			if err != nil {
				return err
			}
			perCallNames, perCallMedians = append(perCallNames, name), append(perCallMedians, m)
		}
		results = append(results, result{name: name, limit: load.Median(limits), ours: load.Median(ourRuns),
			limitCPU: load.MedianDuration(limitCPU), oursCPU: load.MedianDuration(ourCPU),
			clientCPU: load.MedianDuration(clientCPU), lone: load.MedianDuration(lone)})
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "Postgres store benchmark: %d clients, %v per run, prepared statements, median of %d rounds\n\n", clients, duration, rounds)
	fmt.Fprintln(w, "table\tpgbench acquire+complete\tour Acquire+Complete\tratio\tgoal\t")
	for _, r := range results {
		fmt.Fprintf(w, "%s\t%.0f tx/s\t%.0f cycles/s\t%.3f\t≥ 0.80\t\n", r.name, r.limit, r.ours, r.ours/r.limit)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "table\tserver CPU per pgbench tx\tserver CPU per cycle of ours\tratio\tour client's CPU per cycle\tone client, Acquire+Complete\t")
	for _, r := range results {
		fmt.Fprintf(w, "%s\t%s\t%s\t%.3f\t%s\t%s\t\n", r.name, micros(r.limitCPU), micros(r.oursCPU),
			float64(r.oursCPU)/float64(r.limitCPU), micros(r.clientCPU), micros(r.lone))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if perCallNames == nil {
		return nil
	}
	return printPerCall(os.Stdout, perCallNames, perCallMedians, rounds)
}

// loneCycles is how many cycles one client runs, one after another, for
// the median latency.
const loneCycles = 500

func micros(d time.Duration) string {
	return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
}

// pgbench runs the store's own two statements, acquire and complete, as
// one pgbench transaction on fresh random keys.
func pgbench(url string, store *pgstore.Store, clients int, duration time.Duration) (float64, error) {
	bin, err := exec.LookPath("pgbench")
	if err != nil {
		return 0, fmt.Errorf("pgbench is not installed (postgresql-client): %w", err)
	}
	acquire, complete, err := statements(url, store)
	if err != nil {
		return 0, err
	}
	script := "\\set k random(1, 9000000000000000)\n" +
		oneLine(acquire) + "\n\\gset\n" +
		oneLine(complete) + ";\n"
	dir, err := os.MkdirTemp("", "pgbench")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "cycle.sql")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		return 0, err
	}
	out, err := exec.Command(bin, "-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", "2",
		"-T", strconv.Itoa(int(duration.Seconds())), "-f", file, url).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench: %w\n%s\nscript:\n%s", err, out, script)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench printed no tps:\n%s", out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// The key and owner of the cycle that statements records.
const (
	sampleKey   = "pgbench-sample"
	sampleOwner = "pgbench-sample-owner"
)

// statements returns the SQL of the store's Acquire and Complete as it
// sends them, recorded by a pgx tracer on a store of its own on the same
// table, with pgbench variables in place of the bind parameters: :k makes
// the key and the owner, :token is the acquire's token (\gset).
func statements(url string, store *pgstore.Store) (acquire, complete string, err error) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return "", "", err
	}
	rec := &recorder{}
	cfg.ConnConfig.Tracer = rec
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return "", "", err
	}
	defer pool.Close()
	opts := store.Options()
	opts.Wake = pgstore.WakePoll // no listener: nothing else on the connection
	sample, err := pgstore.New(pool, opts)
	if err != nil {
		return "", "", err
	}
	if err := pool.Ping(ctx); err != nil { // connect before recording
		return "", "", err
	}
	rec.reset()
	res, err := sample.Acquire(ctx, backends.AcquireRequest{Key: sampleKey, Owner: sampleOwner, LeaseTTL: 30 * time.Second, Retention: time.Hour,
		Origin: load.Origin(sampleKey)})
	if err != nil {
		return "", "", err
	}
	acq := rec.reset()
	if err := sample.Complete(ctx, res.Lease, nil); err != nil {
		return "", "", err
	}
	compl := rec.reset()
	if len(acq) != 1 || len(compl) != 1 {
		return "", "", fmt.Errorf("recorded %d statements for an Acquire and %d for a Complete, want one each", len(acq), len(compl))
	}
	if acquire, err = withVariables(acq[0], nil); err != nil {
		return "", "", err
	}
	if complete, err = withVariables(compl[0], &res.Lease.Token); err != nil {
		return "", "", err
	}
	return acquire, complete, nil
}

// withVariables is q's SQL with each bind parameter replaced: the sample
// key and owner by expressions of :k, the lease's token (if token is not
// nil) by :token, another number by itself, a NULL by NULL.
func withVariables(q pgx.TraceQueryStartData, token *int64) (string, error) {
	var bad error
	sql := regexp.MustCompile(`\$[0-9]+`).ReplaceAllStringFunc(q.SQL, func(p string) string {
		i, _ := strconv.Atoi(p[1:])
		if i < 1 || i > len(q.Args) {
			bad = fmt.Errorf("parameter %s of %d in %s", p, len(q.Args), q.SQL)
			return p
		}
		switch v := q.Args[i-1].(type) {
		case nil:
			return "NULL::bytea"
		case []byte:
			switch {
			case v == nil:
				return "NULL::bytea"
			case string(v) == sampleKey:
				return "convert_to('k' || :k, 'UTF8')"
			}
		case string:
			switch v {
			case sampleOwner:
				return "'o' || :k"
			case load.Origin(sampleKey): // 70 bytes, as the middleware's
				return "'message_uuid=' || lpad(:k::text, 36, '0') || ' handler=charge-order'"
			}
		case int64:
			if token != nil && v == *token {
				return ":token"
			}
			return strconv.FormatInt(v, 10)
		}
		bad = fmt.Errorf("parameter %s: an argument %#v of no known meaning", p, q.Args[i-1])
		return p
	})
	return sql, bad
}

// recorder is a pgx tracer that keeps the statements sent.
type recorder struct {
	mu      sync.Mutex
	queries []pgx.TraceQueryStartData
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queries = append(r.queries, data)
	return ctx
}

func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// reset returns the statements recorded so far and forgets them.
func (r *recorder) reset() []pgx.TraceQueryStartData {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queries
	r.queries = nil
	return q
}

// oneLine drops comments and line breaks: pgbench reads a statement per line.
func oneLine(sql string) string {
	var parts []string
	for _, l := range strings.Split(sql, "\n") {
		if i := strings.Index(l, "--"); i >= 0 {
			l = l[:i]
		}
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, " ")
}
