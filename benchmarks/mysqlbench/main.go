// Command mysqlbench measures the MySQL store against its own two
// statements for a fresh key, Acquire's insert with RETURNING and
// Complete's update, as the store sends them, run raw, prepared once and unprepared, through
// the same driver and pool
// (database/sql, go-sql-driver/mysql), on the same server, at the same
// concurrency, in one run; then, for a server on this machine, the server
// CPU of each kind of call on its own, on one connection, beside the
// statements of e2ebench's hand-written lease. MariaDB 10.5 or later: on
// MySQL, Acquire is not one statement.
//
//	go run ./mysqlbench -dsn 'root@tcp(127.0.0.1:3306)/test' -clients 16 -duration 5s
package main

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-idempotency/idempotency/backends"
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
	// raw runs the store's two statements itself: prepared once, as the
	// store sends them, or unprepared, as it sent them before, which with
	// the driver's defaults prepares, executes and closes each every time.
	raw := func(prepared bool) func(store *mysqlstore.Store) (func(ctx context.Context, key string) error, error) {
		return func(store *mysqlstore.Store) (func(ctx context.Context, key string) error, error) {
			acquire, complete, err := statements(ctx, dsn, store)
			if err != nil {
				return nil, err
			}
			query := db.QueryContext
			exec := db.ExecContext
			if prepared {
				acq, err := db.PrepareContext(ctx, acquire.query)
				if err != nil {
					return nil, err
				}
				compl, err := db.PrepareContext(ctx, complete.query)
				if err != nil {
					return nil, err
				}
				query = func(ctx context.Context, _ string, args ...any) (*sql.Rows, error) {
					return acq.QueryContext(ctx, args...)
				}
				exec = func(ctx context.Context, _ string, args ...any) (sql.Result, error) {
					return compl.ExecContext(ctx, args...)
				}
			}
			return func(ctx context.Context, key string) error {
				rows, err := query(ctx, acquire.query, acquire.with(key, 0)...)
				if err != nil {
					return err
				}
				token, err := scanToken(rows)
				if err != nil {
					return err
				}
				_, err = exec(ctx, complete.query, complete.with(key, token)...)
				return err
			}, nil
		}
	}
	ours := func(store *mysqlstore.Store) (func(ctx context.Context, key string) error, error) {
		return load.StoreCycle(store), nil
	}
	server, err := findServer(ctx, db)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mysqlbench: server CPU not measured:", err)
	}
	// Per measurement: cycles per second, the server's CPU and ours per
	// cycle, and one client's median cycle.
	type measured struct {
		rates                 []float64
		server, client, alone []time.Duration
	}
	var raws, unprepared, ourRuns measured
	measure := func(op func(*mysqlstore.Store) (func(context.Context, string) error, error), into *measured) error {
		store, drop, err := fresh()
		defer func() {
			if drop != nil {
				drop()
			}
		}()
		if err != nil {
			return err
		}
		cycle, err := op(store)
		if err != nil {
			return err
		}
		var before time.Duration
		if server.pid != 0 {
			if before, err = server.used(); err != nil {
				return err
			}
		}
		self, start := selfCPU(), time.Now()
		v, err := load.Cycles(clients, duration, cycle)
		if err != nil {
			return err
		}
		cycles := v * time.Since(start).Seconds()
		into.rates = append(into.rates, v)
		into.client = append(into.client, time.Duration(float64(selfCPU()-self)/cycles))
		if server.pid != 0 {
			after, err := server.used()
			if err != nil {
				return err
			}
			into.server = append(into.server, time.Duration(float64(after-before)/cycles))
		}
		alone, err := load.Sequential(loneCycles, cycle)
		into.alone = append(into.alone, alone)
		return err
	}
	if err := load.Rounds(rounds,
		func() error { return measure(raw(true), &raws) },
		func() error { return measure(ours, &ourRuns) },
		func() error { return measure(raw(false), &unprepared) },
	); err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "MySQL store benchmark on %s: %d clients, %v per run, median of %d rounds\n\n", version, clients, duration, rounds)
	fmt.Fprintln(w, "\tits two statements, raw, unprepared\tthe same, prepared once\tour Acquire+Complete\tours / prepared\tprepared / unprepared\t")
	u, r, o := load.Median(unprepared.rates), load.Median(raws.rates), load.Median(ourRuns.rates)
	fmt.Fprintf(w, "cycles/s\t%.0f\t%.0f\t%.0f\t%.3f (goal ≥ 0.80)\t%.3f\t\n", u, r, o, o/r, r/u)
	row := func(name string, unprep, raw, ours []time.Duration) {
		if len(raw) == 0 {
			return
		}
		u, r, o := load.MedianDuration(unprep), load.MedianDuration(raw), load.MedianDuration(ours)
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.3f\t%.3f\t\n", name, micros(u), micros(r), micros(o), float64(o)/float64(r), float64(r)/float64(u))
	}
	row("server CPU per cycle", unprepared.server, raws.server, ourRuns.server)
	row("client CPU per cycle", unprepared.client, raws.client, ourRuns.client)
	row("one client, median cycle", unprepared.alone, raws.alone, ourRuns.alone)
	if err := w.Flush(); err != nil {
		return err
	}
	if server.pid == 0 {
		return nil
	}
	store, drop, err := fresh()
	if drop != nil {
		defer drop()
	}
	if err != nil {
		return err
	}
	medians, err := perCall(ctx, dsn, store.Options().Table, server, rounds)
	if err != nil {
		return err
	}
	return printPerCall(os.Stdout, medians, rounds)
}

// loneCycles is how many cycles one client runs, one after another, for
// the median latency.
const loneCycles = 500

func micros(d time.Duration) string {
	return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
}

// The key and owner of the cycle that statements records.
const (
	sampleKey   = "mysqlbench-sample"
	sampleOwner = "mysqlbench-sample-owner"
)

// statements returns Acquire's and Complete's statements as the store
// sends them, recorded by a connector of its own around the driver's, on
// a store of its own on the same table. The acquire must be one statement
// (MariaDB's, with RETURNING): on MySQL, Acquire runs an upsert and a
// read in a transaction, which this benchmark does not replay.
func statements(ctx context.Context, dsn string, store *mysqlstore.Store) (acquire, complete recorded, err error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return recorded{}, recorded{}, err
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return recorded{}, recorded{}, err
	}
	rec := &recorder{Connector: connector}
	db := sql.OpenDB(rec)
	defer db.Close()
	sample, err := mysqlstore.New(db, store.Options())
	if err != nil {
		return recorded{}, recorded{}, err
	}
	// The first Acquire detects the server's flavor: record the second.
	for i := range 2 {
		rec.reset()
		res, err := sample.Acquire(ctx, backends.AcquireRequest{Key: fmt.Sprint(sampleKey, i), Owner: sampleOwner, LeaseTTL: 30 * time.Second, Retention: time.Hour,
			Origin: load.Origin(fmt.Sprint(sampleKey, i))})
		if err != nil {
			return recorded{}, recorded{}, err
		}
		acq := rec.reset()
		if err := sample.Complete(ctx, res.Lease, nil); err != nil {
			return recorded{}, recorded{}, err
		}
		compl := rec.reset()
		if i == 0 {
			continue
		}
		if len(acq) != 1 || len(compl) != 1 {
			return recorded{}, recorded{}, fmt.Errorf("recorded %d statements for an Acquire and %d for a Complete, want one each (MariaDB 10.5 or later)", len(acq), len(compl))
		}
		acquire, complete = acq[0], compl[0]
		acquire.key, complete.key = []byte(fmt.Sprint(sampleKey, i)), []byte(fmt.Sprint(sampleKey, i))
		complete.token = res.Lease.Token
	}
	return acquire, complete, nil
}

// recorded is a statement as sent, with its arguments, and the sample
// key and token they hold.
type recorded struct {
	query string
	args  []any
	key   []byte
	token int64
}

// with returns the statement's arguments for key: the sample key and
// owner replaced by key, the sample token by token.
func (r recorded) with(key string, token int64) []any {
	args := make([]any, len(r.args))
	for i, a := range r.args {
		switch v := a.(type) {
		case []byte:
			if bytes.Equal(v, r.key) || string(v) == sampleOwner {
				a = []byte(key)
			}
		case int64:
			if r.token != 0 && v == r.token {
				a = token
			}
		}
		args[i] = a
	}
	return args
}

// scanToken reads the token column of the one row of an acquire.
func scanToken(rows *sql.Rows) (int64, error) {
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return 0, err
	}
	var token int64
	dest := make([]any, len(cols))
	for i, c := range cols {
		if c == "token" {
			dest[i] = &token
		} else {
			dest[i] = new(sql.RawBytes)
		}
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return 0, err
		}
		return 0, errors.New("the acquire returned no row")
	}
	if err := rows.Scan(dest...); err != nil {
		return 0, err
	}
	return token, rows.Close()
}

// recorder is a database/sql connector that records each statement sent
// through it, with its arguments. Its connections make database/sql
// prepare every statement, so that each passes through one place.
type recorder struct {
	driver.Connector
	mu    sync.Mutex
	stmts []recorded
}

func (r *recorder) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := r.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: c, r: r}, nil
}

func (r *recorder) add(query string, args []driver.NamedValue) {
	r.mu.Lock()
	defer r.mu.Unlock()
	vals := make([]any, len(args))
	for i, a := range args {
		vals[i] = a.Value
	}
	r.stmts = append(r.stmts, recorded{query: query, args: vals})
}

// reset returns the statements recorded so far and forgets them.
func (r *recorder) reset() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stmts
	r.stmts = nil
	return s
}

type recordingConn struct {
	driver.Conn
	r *recorder
}

func (c *recordingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &recordingStmt{Stmt: st, query: query, r: c.r}, nil
}

type recordingStmt struct {
	driver.Stmt
	query string
	r     *recorder
}

func (s *recordingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.r.add(s.query, args)
	return s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *recordingStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.r.add(s.query, args)
	return s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
}
