// Command statebench measures what one collection of contrib/idemotel's store
// gauges costs: a backends.Lister Count of one namespace, on each store,
// with 10,000 and 100,000 records in the namespace, and of an empty
// namespace beside them. It reports the median time of a Count and what
// the server did for it: Redis's commands and their server time (INFO
// commandstats), the plan Postgres ran and the buffers it used
// (auto_explain), the rows MariaDB read and its buffer pool page requests
// (global status), the read capacity a DynamoDB Scan consumed.
//
//	go run ./statebench -redis 127.0.0.1:6379 -pg postgres://... -mysql root@tcp(...)/test -dynamo http://127.0.0.1:8000
//
// Every server should be a private one that nothing else uses while it
// runs (make bench-state starts them): the server-side figures are
// deltas of counters global to the server. A store left out (its flag
// empty) is skipped.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
)

func main() {
	redisAddr := flag.String("redis", "", "Redis address (host:port); empty skips Redis")
	pgURL := flag.String("pg", "", "Postgres URL; empty skips Postgres")
	mysqlDSN := flag.String("mysql", "", "MySQL/MariaDB DSN; empty skips it")
	dynamo := flag.String("dynamo", "", "DynamoDB endpoint (dynalite); empty skips DynamoDB")
	sizes := flag.String("n", "10000,100000", "records in the namespace, comma-separated")
	runs := flag.Int("runs", 5, "Counts per measurement; the median is reported")
	flag.Parse()
	var ns []int
	for s := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "statebench: -n: %q is not a positive number\n", s)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	b := &bench{runs: *runs, sizes: ns}
	ctx := context.Background()
	var err error
	for _, s := range []struct {
		name string
		set  bool
		fn   func(context.Context) error
	}{
		{"memory", true, b.memory},
		{"redis", *redisAddr != "", func(ctx context.Context) error { return b.redis(ctx, *redisAddr) }},
		{"postgres", *pgURL != "", func(ctx context.Context) error { return b.postgres(ctx, *pgURL) }},
		{"mysql", *mysqlDSN != "", func(ctx context.Context) error { return b.mysql(ctx, *mysqlDSN) }},
		{"dynamodb", *dynamo != "", func(ctx context.Context) error { return b.dynamo(ctx, *dynamo) }},
	} {
		if !s.set {
			continue
		}
		if err = s.fn(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "statebench: %s: %v\n", s.name, err)
			os.Exit(1)
		}
	}
	b.print()
}

type bench struct {
	runs  int
	sizes []int
	rows  []row
}

// row is one measurement.
type row struct {
	store, what string
	median      time.Duration
	server      string
}

// work reads a server's counters: what it did between two reads.
type work struct {
	before func(context.Context) (map[string]float64, error)
	// describe turns the difference per Count into words.
	describe func(delta map[string]float64) string
	// afterFill, if set, runs after each fill.
	afterFill func(context.Context) error
}

// fill writes n records in namespace ns through the store: one in ten in
// progress, the others completed, as a store in use holds them.
func fill(ctx context.Context, store backends.Store, ns string, n int) error {
	const workers = 32
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				res, err := store.Acquire(ctx, backends.AcquireRequest{Key: fmt.Sprintf("%s:k%07d", ns, i), Owner: "statebench",
					LeaseTTL: time.Hour, Retention: 24 * time.Hour})
				if err == nil && res.Status == backends.StatusAcquired && i%10 != 0 {
					err = store.Complete(ctx, res.Lease, nil)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// measure fills the store and times Counts of the namespace, for each
// size, and of an empty namespace beside the largest.
func (b *bench) measure(ctx context.Context, name string, store backends.Store, w work) error {
	lister := store.(backends.Lister)
	have := 0
	for _, n := range b.sizes {
		start := time.Now()
		if err := fill(ctx, store, "bench", n); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "statebench: %s: %d records written in %v\n", name, n, time.Since(start).Round(time.Millisecond))
		if w.afterFill != nil {
			if err := w.afterFill(ctx); err != nil {
				return err
			}
		}
		c, err := lister.Count(ctx, "bench")
		if err != nil {
			return err
		}
		if c.Total() != int64(n) {
			return fmt.Errorf("counted %d records, wrote %d", c.Total(), n)
		}
		have = n
		if err := b.time(ctx, name, fmt.Sprintf("%d records in the namespace", n), lister, "bench", w); err != nil {
			return err
		}
	}
	return b.time(ctx, name, fmt.Sprintf("an empty namespace, %d records in another", have), lister, "other", w)
}

func (b *bench) time(ctx context.Context, store, what string, lister backends.Lister, ns string, w work) error {
	var times []time.Duration
	var before map[string]float64
	var err error
	if w.before != nil {
		if before, err = w.before(ctx); err != nil {
			return err
		}
	}
	for range b.runs {
		start := time.Now()
		if _, err := lister.Count(ctx, ns); err != nil {
			return err
		}
		times = append(times, time.Since(start))
	}
	r := row{store: store, what: what}
	slices.Sort(times)
	r.median = times[len(times)/2]
	if w.before != nil {
		after, err := w.before(ctx)
		if err != nil {
			return err
		}
		delta := map[string]float64{}
		for k, v := range after {
			delta[k] = (v - before[k]) / float64(b.runs)
		}
		r.server = w.describe(delta)
	}
	b.rows = append(b.rows, r)
	return nil
}

func (b *bench) print() {
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "store\tCount of\tmedian\tserver work per Count")
	for _, r := range b.rows {
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", r.store, r.what, r.median.Round(10*time.Microsecond), r.server)
	}
	_ = tw.Flush()
}

func (b *bench) memory(ctx context.Context) error {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		return err
	}
	return b.measure(ctx, "memory", store, work{})
}

func (b *bench) redis(ctx context.Context, addr string) error {
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	defer client.Close()
	prefix := fmt.Sprintf("statebench-%d:", time.Now().UnixNano())
	store, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	if err != nil {
		return err
	}
	defer func() {
		iter := client.Scan(context.Background(), 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(context.Background()) {
			if keys = append(keys, iter.Val()); len(keys) == 1000 {
				client.Unlink(context.Background(), keys...)
				keys = keys[:0]
			}
		}
		if len(keys) > 0 {
			client.Unlink(context.Background(), keys...)
		}
	}()
	stats := func(ctx context.Context) (map[string]float64, error) {
		info, err := client.Info(ctx, "commandstats").Result()
		if err != nil {
			return nil, err
		}
		out := map[string]float64{}
		for line := range strings.SplitSeq(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || !strings.HasPrefix(name, "cmdstat_") {
				continue
			}
			cmd := strings.TrimPrefix(name, "cmdstat_")
			for field := range strings.SplitSeq(rest, ",") {
				k, v, _ := strings.Cut(field, "=")
				f, _ := strconv.ParseFloat(v, 64)
				switch k {
				case "calls":
					out[cmd+" calls"] += f
				case "usec":
					out[cmd+" usec"] += f
				}
			}
		}
		return out, nil
	}
	return b.measure(ctx, "redis", store, work{before: stats, describe: func(d map[string]float64) string {
		var calls []string
		for k, v := range d {
			if strings.HasSuffix(k, " calls") && v >= 1 && !strings.HasPrefix(k, "info") {
				calls = append(calls, fmt.Sprintf("%.0f %s", v, strings.TrimSuffix(k, " calls")))
			}
		}
		slices.Sort(calls)
		// The commands a script calls are counted, and timed, within the
		// script's own time: the server time is the top-level commands'.
		usec := d["scan usec"] + d["eval usec"] + d["evalsha usec"]
		return fmt.Sprintf("%s; %.1f ms of server time", strings.Join(calls, ", "), usec/1000)
	}})
}

func (b *bench) postgres(ctx context.Context, url string) error {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	table := fmt.Sprintf("statebench_%d", time.Now().UnixNano()%1e9)
	store, err := pgstore.New(pool, pgstore.Options{Table: table, Wake: pgstore.WakePoll})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	defer pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) //nolint:errcheck
	// The Counts run on a connection of their own where auto_explain
	// sends the plan of every statement, with the buffers it used, as a
	// notice: the plan of the store's own statement, as it ran.
	var mu sync.Mutex
	var plans []map[string]any
	totals := map[string]float64{} // what the plans so far add up to
	cfg1 := cfg.Copy()
	cfg1.MaxConns = 1
	cfg1.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		_, plan, ok := strings.Cut(n.Message, "plan:")
		var p struct {
			Plan map[string]any `json:"Plan"`
		}
		if ok && json.Unmarshal([]byte(plan), &p) == nil {
			mu.Lock()
			plans = append(plans, p.Plan)
			mu.Unlock()
		}
	}
	cfg1.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;
			SET auto_explain.log_buffers = on; SET auto_explain.log_format = 'json'; SET auto_explain.log_level = 'notice'`)
		return err
	}
	one, err := pgxpool.NewWithConfig(ctx, cfg1)
	if err != nil {
		return err
	}
	defer one.Close()
	counter, err := pgstore.New(one, pgstore.Options{Table: table, Wake: pgstore.WakePoll})
	if err != nil {
		return err
	}
	stats := func(ctx context.Context) (map[string]float64, error) {
		// A statement's plan comes when its portal closes: at the next
		// statement.
		if _, err := one.Exec(ctx, "SELECT 1"); err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		out := totals
		for _, p := range plans {
			scan := scanNode(p)
			if _, ok := scan["Relation Name"]; !ok {
				continue // SELECT 1
			}
			out["blocks"] += num(p["Shared Hit Blocks"]) + num(p["Shared Read Blocks"])
			// Per loop: a parallel scan runs once in each process.
			out["rows"] += (num(scan["Actual Rows"]) + num(scan["Rows Removed by Filter"]) + num(scan["Rows Removed by Index Recheck"])) * max(1, num(scan["Actual Loops"]))
			out["workers"] += num(p["Workers Launched"])
			out[fmt.Sprint(scan["Node Type"])]++
		}
		plans = nil
		return maps.Clone(out), nil
	}
	return b.measure(ctx, "postgres", &countWith{Store: store, counter: counter}, work{before: stats, describe: func(d map[string]float64) string {
		var scans []string
		for k, v := range d {
			if k != "blocks" && k != "rows" && k != "workers" && v > 0 {
				scans = append(scans, strings.ToLower(k))
			}
		}
		slices.Sort(scans)
		return fmt.Sprintf("%s: %.0f rows read, %.0f buffers", strings.Join(scans, ", "), d["rows"], d["blocks"])
	}})
}

// scanNode is the node of a plan that reads the table.
func scanNode(p map[string]any) map[string]any {
	for {
		kids, _ := p["Plans"].([]any)
		if _, ok := p["Relation Name"]; ok || len(kids) == 0 {
			return p
		}
		p, _ = kids[0].(map[string]any)
	}
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

// countWith is a store whose Counts go through another store on the
// same table.
type countWith struct {
	backends.Store
	counter backends.Lister
}

func (c *countWith) Count(ctx context.Context, ns string) (backends.Counts, error) {
	return c.counter.Count(ctx, ns)
}

func (c *countWith) List(ctx context.Context, req backends.ListRequest) (backends.ListPage, error) {
	return c.counter.List(ctx, req)
}

func (b *bench) mysql(ctx context.Context, dsn string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(32)
	table := fmt.Sprintf("statebench_%d", time.Now().UnixNano()%1e9)
	store, err := mysqlstore.New(db, mysqlstore.Options{Table: table})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	defer db.Exec("DROP TABLE IF EXISTS " + table) //nolint:errcheck
	stats := func(ctx context.Context) (map[string]float64, error) {
		rows, err := db.QueryContext(ctx, `SHOW GLOBAL STATUS WHERE Variable_name IN ('Handler_read_next', 'Handler_read_key', 'Innodb_buffer_pool_read_requests')`)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := map[string]float64{}
		for rows.Next() {
			var k string
			var v float64
			if err := rows.Scan(&k, &v); err != nil {
				return nil, err
			}
			out[k] = v
		}
		return out, rows.Err()
	}
	return b.measure(ctx, "mysql", store, work{before: stats, describe: func(d map[string]float64) string {
		return fmt.Sprintf("an index range scan: %.0f rows read, %.0f buffer pool page requests", d["Handler_read_next"]+d["Handler_read_key"], d["Innodb_buffer_pool_read_requests"])
	}})
}

func (b *bench) dynamo(ctx context.Context, endpoint string) error {
	var mu sync.Mutex
	var rcu, scans float64
	// Every Scan asks for, and adds up, the capacity it consumed.
	capacity := func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("statebench-capacity",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				scan, ok := in.Parameters.(*dynamodb.ScanInput)
				if ok {
					scan.ReturnConsumedCapacity = types.ReturnConsumedCapacityTotal
				}
				out, md, err := next.HandleInitialize(ctx, in)
				if so, isScan := out.Result.(*dynamodb.ScanOutput); isScan && err == nil {
					mu.Lock()
					scans++
					if so.ConsumedCapacity != nil && so.ConsumedCapacity.CapacityUnits != nil {
						rcu += *so.ConsumedCapacity.CapacityUnits
					}
					mu.Unlock()
				}
				return out, md, err
			}), middleware.After)
	}
	api := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "bench", SecretAccessKey: "bench"}, nil
		}),
		HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}},
		APIOptions: []func(*middleware.Stack) error{capacity},
	})
	table := fmt.Sprintf("statebench_%d", time.Now().UnixNano()%1e9)
	store, err := dynamostore.New(api, dynamostore.Options{Table: table, TTL: dynamostore.TTLUntouched})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	defer api.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)}) //nolint:errcheck
	stats := func(context.Context) (map[string]float64, error) {
		mu.Lock()
		defer mu.Unlock()
		return map[string]float64{"rcu": rcu, "scans": scans}, nil
	}
	return b.measure(ctx, "dynamodb", store, work{before: stats, describe: func(d map[string]float64) string {
		return fmt.Sprintf("%.0f Scan pages of the whole table, %.0f read capacity units", d["scans"], d["rcu"])
	}})
}
