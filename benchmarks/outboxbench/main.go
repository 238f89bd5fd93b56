// Command outboxbench measures what the transactional outbox
// (contrib/sqloutbox) costs per message against the plain path, and how
// soon its outputs reach the broker after their commit, on Postgres and on
// MariaDB with Redis Streams as the broker, the outbox as it was and as it
// is, in one run:
//
//   - plain: the handler writes its row and completes the key with its
//     output in its own transaction (the store's CompleteTx); the output
//     is then published to the broker, as the router does after the
//     handler returns;
//   - poll100: the outbox as it was. The handler writes its row and its
//     output into the outbox table (watermill-sql's publisher on its
//     transaction, in the Forwarder's envelope) and completes the key in
//     the transaction, as the outbox's Handler did; the middleware then
//     finds the key completed (its Complete fails, an Inspect confirms).
//     watermill-sql's subscriber, under Watermill's Forwarder, polls every
//     100 ms (on MySQL one row per transaction, SERIALIZABLE); the table
//     has no notification trigger;
//   - woken: the outbox's Handler and Forwarder as they are: the commit
//     wakes the Forwarder in process, and the middleware records nothing
//     more after it;
//   - notified (Postgres): poll100's writer, as another service would
//     write, on a table with the trigger, and the outbox's Forwarder: only
//     the Postgres notification wakes it.
//
// For each: the throughput of 16 goroutines until every output is on the
// broker, the latency from each commit to its output read from the broker
// under that load (which saturates the host), the same latency at a
// steady 300 messages/s from 16 goroutines, and for one caller at a time;
// on Postgres, the statements sent per message (a pgx tracer, the
// Forwarder's included). Rounds of the paths interleave; medians of the
// throughput rounds and percentiles of all latencies are printed.
//
// Usage: go run ./outboxbench -url postgres://... -mysql 'root@tcp(...)/test' -redis 127.0.0.1:6379
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/mysqloutbox"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

var (
	pgURL     = flag.String("url", "", "Postgres URL")
	mysqlDSN  = flag.String("mysql", "", "MySQL or MariaDB DSN (skipped if empty)")
	redisAddr = flag.String("redis", "", "Redis address (the broker)")
	messages  = flag.Int("n", 2000, "messages per throughput round")
	rounds    = flag.Int("rounds", 3, "rounds of each path")
	latencyN  = flag.Int("latency", 100, "messages per one-at-a-time latency round")
	workers   = flag.Int("workers", 16, "goroutines for throughput")
	rate      = flag.Int("rate", 300, "messages per second in the paced rounds, from as many goroutines")
	pacedN    = flag.Int("paced", 600, "messages per paced round")
	only      = flag.String("only", "", "run only the paths of this name and plain (for profiling)")
	cpuProf   = flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
)

func main() {
	flag.Parse()
	if *pgURL == "" || *redisAddr == "" {
		fmt.Fprintln(os.Stderr, "usage: outboxbench -url POSTGRES_URL [-mysql MYSQL_DSN] -redis REDIS_ADDR")
		os.Exit(2)
	}
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			fmt.Fprintln(os.Stderr, "outboxbench:", err)
			os.Exit(1)
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "outboxbench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// path is one way to handle a message: handle runs the middleware and the
// handler for msg, whose output goes to the broker's topic, and calls
// committed right after its transaction commits; forward, if set, runs
// what moves the outputs to the broker until its stop.
type path struct {
	name    string
	handle  func(msg *message.Message, topic string, committed func()) error
	forward func() (stop func(), err error)
}

// bench is what the paths of one database share.
type bench struct {
	ctx    context.Context
	db     string
	rdb    *redis.Client
	pub    message.Publisher
	prefix string
	stmts  *atomic.Int64 // statements sent, if counted
	paths  []path
}

func run() error {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: 64})
	defer rdb.Close()
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: rdb}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	prefix := fmt.Sprintf("ob%d_", time.Now().UnixNano()%1e9)
	defer func() {
		keys, _ := rdb.Keys(context.Background(), prefix+"*").Result()
		if len(keys) > 0 {
			rdb.Del(context.Background(), keys...)
		}
	}()
	fmt.Printf("outboxbench: %d rounds of each path, interleaved; %d messages from %d goroutines per throughput round; %d messages one at a time per latency round\n",
		*rounds, *messages, *workers, *latencyN)
	fmt.Printf("latency: from the commit of the handler's transaction to its output read from the broker; under load: in the throughput rounds\n")
	pg, cleanup, err := postgresBench(ctx, rdb, pub, prefix+"pg_")
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer cleanup()
	if err := pg.measure(); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if *mysqlDSN != "" {
		my, cleanup, err := mysqlBench(ctx, rdb, pub, prefix+"my_")
		if err != nil {
			return fmt.Errorf("mariadb: %w", err)
		}
		defer cleanup()
		if err := my.measure(); err != nil {
			return fmt.Errorf("mariadb: %w", err)
		}
	}
	return nil
}

// counter counts the statements a pool sends.
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func idem(store backends.Store, ns string) *idempotency.Idempotency {
	idem, err := idempotency.New(idempotency.Config{Store: store, Key: keyfunc.Metadata("order"), Namespace: ns})
	if err != nil {
		panic(err) // the configuration is fixed here
	}
	return idem
}

// receipt is msg's output; its UUID is msg's, which the reader of the
// broker matches.
func receipt(msg *message.Message) *message.Message {
	return message.NewMessage(msg.UUID, []byte(`{"order_id":"`+msg.Metadata.Get("order")+`","amount_cents":1000}`))
}

// commitKey carries, in a message's context, what to call when its
// transaction has committed.
type commitKey struct{}

// outboxHandler is the woken path's handler: the outbox's Handler made by
// handler, under the middleware; the Handler returns when the transaction
// has committed.
func outboxHandler(id *idempotency.Idempotency, handler func(topic func() string) message.NoPublishHandlerFunc) func(*message.Message, string, func()) error {
	var topic atomic.Value // one per round
	inner := handler(func() string { return topic.Load().(string) })
	h := id.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if err := inner(msg); err != nil {
			return nil, err
		}
		msg.Context().Value(commitKey{}).(func())()
		return nil, nil
	})
	return func(msg *message.Message, t string, committed func()) error {
		topic.Store(t)
		msg.SetContext(context.WithValue(msg.Context(), commitKey{}, committed))
		_, err := h(msg)
		return err
	}
}

// wmForwarder is the Forwarder as it was before it could be woken:
// watermill-sql's subscriber polling every 100 ms, under Watermill's
// Forwarder.
func (b *bench) wmForwarder(db wsql.Beginner, cfg wsql.SubscriberConfig, topic string) func() (func(), error) {
	return func() (func(), error) {
		cfg.PollInterval = 100 * time.Millisecond
		sub, err := wsql.NewSubscriber(db, cfg, nil)
		if err != nil {
			return nil, err
		}
		fwd, err := forwarder.NewForwarder(sub, b.pub, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: topic})
		if err != nil {
			return nil, err
		}
		return b.runForwarder(fwd)
	}
}

func (b *bench) runForwarder(fwd *forwarder.Forwarder) (func(), error) {
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = fwd.Run(ctx) }()
	<-fwd.Running()
	return func() { cancel(); _ = fwd.Close(); <-done }, nil
}

func postgresBench(ctx context.Context, rdb *redis.Client, pub message.Publisher, prefix string) (*bench, func(), error) {
	cfg, err := pgxpool.ParseConfig(*pgURL)
	if err != nil {
		return nil, nil, err
	}
	stmts := &counter{}
	cfg.ConnConfig.Tracer = stmts
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	charges := prefix + "charges"
	cleanup := func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+charges+`, `+prefix+`keys`)
		for _, t := range []string{"poll", "woken", "other"} {
			_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS "watermill_`+prefix+t+`", "watermill_offsets_`+prefix+t+`"`)
		}
		pool.Close()
	}
	fail := func(err error) (*bench, func(), error) { cleanup(); return nil, nil, err }
	store, err := pgstore.New(pool, pgstore.Options{Table: prefix + "keys"})
	if err != nil {
		return fail(err)
	}
	if err := store.Migrate(ctx); err != nil {
		return fail(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+charges+` (order_id text NOT NULL, token bigint NOT NULL)`); err != nil {
		return fail(err)
	}
	outboxes := map[string]*sqloutbox.Postgres{}
	for _, t := range []string{"poll", "woken", "other"} {
		ob, err := sqloutbox.NewPostgres(pool, store, sqloutbox.Options{Topic: prefix + t})
		if err != nil {
			return fail(err)
		}
		if err := ob.Migrate(ctx); err != nil {
			return fail(err)
		}
		outboxes[t] = ob
	}
	// The table of the outbox as it was: no notification trigger.
	if _, err := pool.Exec(ctx, `DROP TRIGGER sqloutbox_notify ON "watermill_`+prefix+`poll"`); err != nil {
		return fail(err)
	}
	b := &bench{ctx: ctx, db: "Postgres", rdb: rdb, pub: pub, prefix: prefix, stmts: &stmts.n}
	write := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		lease, _ := idempotency.LeaseFromContext(ctx)
		_, err := tx.Exec(ctx, `INSERT INTO `+charges+` VALUES ($1, $2)`, msg.Metadata.Get("order"), lease.Token)
		return err
	}
	viaOutbox := func(ob *sqloutbox.Postgres) func(topic func() string) message.NoPublishHandlerFunc {
		return func(topic func() string) message.NoPublishHandlerFunc {
			return ob.Handler(func(tx *sqloutbox.PgxTx, msg *message.Message) error {
				if err := write(msg.Context(), tx.Tx, msg); err != nil {
					return err
				}
				return tx.Publish(topic(), receipt(msg))
			})
		}
	}
	// foreign writes as the outbox's Handler did before it could wake
	// the Forwarder, and as another service may: watermill-sql's
	// publisher on the transaction, in the Forwarder's envelope, and the
	// key completed in it; the middleware then finds the key completed.
	foreign := func(id *idempotency.Idempotency, t string) func(*message.Message, string, func()) error {
		return func(msg *message.Message, topic string, committed func()) error {
			_, err := id.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				ctx := msg.Context()
				lease, _ := idempotency.LeaseFromContext(ctx)
				tx, err := pool.Begin(ctx)
				if err != nil {
					return nil, err
				}
				defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it is a no-op
				if err := write(ctx, tx, msg); err != nil {
					return nil, err
				}
				wp, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, nil)
				if err != nil {
					return nil, err
				}
				fp := forwarder.NewPublisher(wp, forwarder.PublisherConfig{ForwarderTopic: prefix + t})
				if err := fp.Publish(topic, receipt(msg)); err != nil {
					return nil, err
				}
				if err := store.CompleteTx(ctx, tx, lease, nil); err != nil {
					return nil, err
				}
				if err := tx.Commit(ctx); err != nil {
					return nil, err
				}
				committed()
				return nil, nil
			})(msg)
			return err
		}
	}
	plainIdem, otherIdem := idem(store, "plain"), idem(store, "other")
	b.paths = []path{
		{name: "plain", handle: func(msg *message.Message, topic string, committed func()) error {
			out, err := plainIdem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				ctx := msg.Context()
				lease, _ := idempotency.LeaseFromContext(ctx)
				out := []*message.Message{receipt(msg)}
				tx, err := pool.Begin(ctx)
				if err != nil {
					return nil, err
				}
				defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it is a no-op
				if err := write(ctx, tx, msg); err != nil {
					return nil, err
				}
				if err := store.CompleteTx(ctx, tx, lease, out); err != nil {
					return nil, err
				}
				if err := tx.Commit(ctx); err != nil {
					return nil, err
				}
				committed()
				return out, nil
			})(msg)
			if err != nil {
				return err
			}
			return pub.Publish(topic, out...) // what the router does with the output
		}},
		{
			name:    "poll100",
			handle:  foreign(idem(store, "poll"), "poll"),
			forward: b.wmForwarder(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{}}, prefix+"poll"),
		},
		{
			name:    "woken",
			handle:  outboxHandler(idem(store, "woken"), viaOutbox(outboxes["woken"])),
			forward: b.forwarder(outboxes["woken"].NewForwarder),
		},
		{
			// Another writer: nothing wakes the Forwarder in process.
			name:    "notified",
			handle:  foreign(otherIdem, "other"),
			forward: b.forwarder(outboxes["other"].NewForwarder),
		},
	}
	return b, cleanup, nil
}

func mysqlBench(ctx context.Context, rdb *redis.Client, pub message.Publisher, prefix string) (*bench, func(), error) {
	db, err := sql.Open("mysql", *mysqlDSN)
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	charges := prefix + "charges"
	cleanup := func() {
		_, _ = db.Exec(`DROP TABLE IF EXISTS ` + charges + `, ` + prefix + `keys, watermill_` + prefix + `poll, watermill_` + prefix + `woken`)
		_ = db.Close()
	}
	fail := func(err error) (*bench, func(), error) { cleanup(); return nil, nil, err }
	store, err := mysqlstore.New(db, mysqlstore.Options{Table: prefix + "keys"})
	if err != nil {
		return fail(err)
	}
	if err := store.Migrate(ctx); err != nil {
		return fail(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+charges+` (order_id varchar(64) NOT NULL, token bigint NOT NULL)`); err != nil {
		return fail(err)
	}
	outboxes := map[string]*mysqloutbox.Outbox{}
	for _, t := range []string{"poll", "woken"} {
		ob, err := mysqloutbox.New(db, store, mysqloutbox.Options{Topic: prefix + t})
		if err != nil {
			return fail(err)
		}
		if err := ob.Migrate(ctx); err != nil {
			return fail(err)
		}
		outboxes[t] = ob
	}
	b := &bench{ctx: ctx, db: "MariaDB", rdb: rdb, pub: pub, prefix: prefix}
	write := func(ctx context.Context, tx interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}, msg *message.Message) error {
		lease, _ := idempotency.LeaseFromContext(ctx)
		_, err := tx.ExecContext(ctx, `INSERT INTO `+charges+` VALUES (?, ?)`, msg.Metadata.Get("order"), lease.Token)
		return err
	}
	viaOutbox := func(ob *mysqloutbox.Outbox) func(topic func() string) message.NoPublishHandlerFunc {
		return func(topic func() string) message.NoPublishHandlerFunc {
			return ob.Handler(func(tx *mysqloutbox.Tx, msg *message.Message) error {
				if err := write(msg.Context(), tx.Tx, msg); err != nil {
					return err
				}
				return tx.Publish(topic(), receipt(msg))
			})
		}
	}
	// foreign writes as the outbox's Handler did before it could wake
	// the Forwarder (see postgresBench).
	foreign := func(id *idempotency.Idempotency, t string) func(*message.Message, string, func()) error {
		return func(msg *message.Message, topic string, committed func()) error {
			_, err := id.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				ctx := msg.Context()
				lease, _ := idempotency.LeaseFromContext(ctx)
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return nil, err
				}
				defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
				if err := write(ctx, tx, msg); err != nil {
					return nil, err
				}
				wp, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.MySQLQueueSchema{}}, nil)
				if err != nil {
					return nil, err
				}
				fp := forwarder.NewPublisher(wp, forwarder.PublisherConfig{ForwarderTopic: prefix + t})
				if err := fp.Publish(topic, receipt(msg)); err != nil {
					return nil, err
				}
				if err := store.CompleteTx(ctx, tx, lease, nil); err != nil {
					return nil, err
				}
				if err := tx.Commit(); err != nil {
					return nil, err
				}
				committed()
				return nil, nil
			})(msg)
			return err
		}
	}
	plainIdem := idem(store, "plain")
	b.paths = []path{
		{name: "plain", handle: func(msg *message.Message, topic string, committed func()) error {
			out, err := plainIdem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				ctx := msg.Context()
				lease, _ := idempotency.LeaseFromContext(ctx)
				out := []*message.Message{receipt(msg)}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return nil, err
				}
				defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
				if err := write(ctx, tx, msg); err != nil {
					return nil, err
				}
				if err := store.CompleteTx(ctx, tx, lease, out); err != nil {
					return nil, err
				}
				if err := tx.Commit(); err != nil {
					return nil, err
				}
				committed()
				return out, nil
			})(msg)
			if err != nil {
				return err
			}
			return pub.Publish(topic, out...)
		}},
		{
			name:   "poll100",
			handle: foreign(idem(store, "poll"), "poll"),
			forward: b.wmForwarder(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
				SchemaAdapter: wsql.MySQLQueueSchema{SubscribeBatchSize: 1}, OffsetsAdapter: wsql.MySQLQueueOffsetsAdapter{},
			}, prefix+"poll"),
		},
		{
			name:    "woken",
			handle:  outboxHandler(idem(store, "woken"), viaOutbox(outboxes["woken"])),
			forward: b.forwarder(outboxes["woken"].NewForwarder),
		},
	}
	return b, cleanup, nil
}

// forwarder runs the outbox's own Forwarder, made by newForwarder.
func (b *bench) forwarder(newForwarder func(message.Publisher, watermill.LoggerAdapter, forwarder.Config) (*forwarder.Forwarder, error)) func() (func(), error) {
	return func() (func(), error) {
		fwd, err := newForwarder(b.pub, nil, forwarder.Config{})
		if err != nil {
			return nil, err
		}
		return b.runForwarder(fwd)
	}
}

// measure runs the rounds of every path and prints them.
func (b *bench) measure() error {
	thr := map[string][]float64{}
	loaded := map[string][]time.Duration{}
	paced := map[string][]time.Duration{}
	alone := map[string][]time.Duration{}
	per := map[string][]float64{}
	paths := b.paths[:0:0]
	for _, p := range b.paths {
		if *only == "" || p.name == *only || p.name == "plain" {
			paths = append(paths, p)
		}
	}
	b.paths = paths
	for r := range *rounds {
		for _, p := range b.paths {
			tp, spm, lat, err := b.throughput(p, fmt.Sprintf("%s-t%d", p.name, r))
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			thr[p.name] = append(thr[p.name], tp)
			per[p.name] = append(per[p.name], spm)
			loaded[p.name] = append(loaded[p.name], lat...)
			ls, err := b.latency(p, fmt.Sprintf("%s-l%d", p.name, r))
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			alone[p.name] = append(alone[p.name], ls...)
			ps, err := b.paced(p, fmt.Sprintf("%s-p%d", p.name, r))
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			paced[p.name] = append(paced[p.name], ps...)
		}
	}
	fmt.Printf("\n%s\n", b.db)
	stmts := ""
	if b.stmts != nil {
		stmts = "statements/msg"
	}
	fmt.Printf("%-9s %14s %11s %8s   %-34s %-34s %-34s\n", "path", stmts, "messages/s", "× plain",
		"latency, saturated: p50/p90/p99", fmt.Sprintf("latency at %d/s: p50/p90/p99", *rate), "latency alone: p50/p90/p99")
	plain := medianF(thr["plain"])
	for _, p := range b.paths {
		s := ""
		if b.stmts != nil {
			s = fmt.Sprintf("%.2f", medianF(per[p.name]))
		}
		fmt.Printf("%-9s %14s %11.0f %7.2f×   %-34s %-34s %-34s\n", p.name, s, medianF(thr[p.name]), medianF(thr[p.name])/plain,
			pcts(loaded[p.name]), pcts(paced[p.name]), pcts(alone[p.name]))
	}
	fmt.Printf("throughput rounds (messages/s): ")
	for _, p := range b.paths {
		fmt.Printf("%s %s; ", p.name, joinF(thr[p.name]))
	}
	fmt.Println()
	return nil
}

func pcts(v []time.Duration) string {
	return fmt.Sprintf("%v / %v / %v", ms(pct(v, 0.5)), ms(pct(v, 0.9)), ms(pct(v, 0.99)))
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) + " ms" }

func joinF(v []float64) string {
	s := make([]string, len(v))
	for i, f := range v {
		s[i] = strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strings.Join(s, ", ")
}

// arrivals reads topic on the broker and records when each output
// (numbered by its UUID, round-i) arrives; each arrival's number is sent
// on seen if it is not nil.
type arrivals struct {
	at   []atomic.Int64 // unix nanoseconds
	seen chan int
	n    atomic.Int64
}

func (b *bench) read(ctx context.Context, topic string, n int, seen chan int) (*arrivals, <-chan error) {
	a := &arrivals{at: make([]atomic.Int64, n), seen: seen}
	errc := make(chan error, 1)
	go func() {
		last := "0"
		for int(a.n.Load()) < n {
			res, err := b.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{topic, last}, Count: 500, Block: 30 * time.Second}).Result()
			if err != nil {
				errc <- fmt.Errorf("reading the broker: %w", err)
				return
			}
			now := time.Now().UnixNano()
			for _, m := range res[0].Messages {
				last = m.ID
				id, _ := m.Values[redisstream.UUIDHeaderKey].(string)
				i, err := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
				if err != nil || i >= n {
					errc <- fmt.Errorf("unexpected output %q", id)
					return
				}
				if a.at[i].CompareAndSwap(0, now) {
					a.n.Add(1)
					if seen != nil {
						seen <- i
					}
				}
			}
		}
		errc <- nil
	}()
	return a, errc
}

func newMsg(round string, i int) *message.Message {
	msg := message.NewMessage(fmt.Sprintf("%s-%d", round, i), nil)
	msg.Metadata.Set("order", fmt.Sprintf("%s-%d", round, i))
	return msg
}

// throughput handles *messages fresh messages from *workers goroutines and
// returns messages per second until every output is on the broker, the
// statements sent per message, and each message's latency from its
// commit to its output on the broker.
func (b *bench) throughput(p path, round string) (float64, float64, []time.Duration, error) {
	topic := b.prefix + round
	if p.forward != nil {
		stop, err := p.forward()
		if err != nil {
			return 0, 0, nil, err
		}
		defer stop()
	}
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Minute)
	defer cancel()
	arr, done := b.read(ctx, topic, *messages, nil)
	committed := make([]int64, *messages)
	var before int64
	if b.stmts != nil {
		before = b.stmts.Load()
	}
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	var wg sync.WaitGroup
	for range *workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= *messages {
					return
				}
				if err := p.handle(newMsg(round, i), topic, func() { committed[i] = time.Now().UnixNano() }); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, 0, nil, firstErr
	}
	if err := <-done; err != nil {
		return 0, 0, nil, err
	}
	var lastArrival int64
	lat := make([]time.Duration, *messages)
	for i := range lat {
		at := arr.at[i].Load()
		lastArrival = max(lastArrival, at)
		lat[i] = time.Duration(at - committed[i])
	}
	elapsed := time.Duration(lastArrival - start.UnixNano())
	var spm float64
	if b.stmts != nil {
		// The Forwarder's statements are counted until its last offset
		// is stored; its idle reads after that are not.
		time.Sleep(50 * time.Millisecond)
		spm = float64(b.stmts.Load()-before) / float64(*messages)
	}
	return float64(*messages) / elapsed.Seconds(), spm, lat, nil
}

// paced handles *pacedN messages from *workers goroutines at *rate
// messages per second, and returns each one's latency from its commit to
// its output on the broker.
func (b *bench) paced(p path, round string) ([]time.Duration, error) {
	topic := b.prefix + round
	if p.forward != nil {
		stop, err := p.forward()
		if err != nil {
			return nil, err
		}
		defer stop()
	}
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Minute)
	defer cancel()
	arr, done := b.read(ctx, topic, *pacedN, nil)
	committed := make([]int64, *pacedN)
	next := make(chan int)
	go func() {
		defer close(next)
		tick := time.NewTicker(time.Second / time.Duration(*rate))
		defer tick.Stop()
		for i := range *pacedN {
			<-tick.C
			next <- i
		}
	}()
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range *workers {
		wg.Go(func() {
			for i := range next {
				if err := p.handle(newMsg(round, i), topic, func() { committed[i] = time.Now().UnixNano() }); err != nil {
					once.Do(func() { firstErr = err })
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := <-done; err != nil {
		return nil, err
	}
	lat := make([]time.Duration, *pacedN)
	for i := range lat {
		lat[i] = time.Duration(arr.at[i].Load() - committed[i])
	}
	return lat, nil
}

// latency handles *latencyN messages one at a time, each from its commit
// to its output read from the broker.
func (b *bench) latency(p path, round string) ([]time.Duration, error) {
	topic := b.prefix + round
	if p.forward != nil {
		stop, err := p.forward()
		if err != nil {
			return nil, err
		}
		defer stop()
	}
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Minute)
	defer cancel()
	seen := make(chan int, *latencyN)
	arr, done := b.read(ctx, topic, *latencyN, seen)
	out := make([]time.Duration, 0, *latencyN)
	for i := range *latencyN {
		var committed int64
		if err := p.handle(newMsg(round, i), topic, func() { committed = time.Now().UnixNano() }); err != nil {
			return nil, err
		}
		var j int
		select {
		case j = <-seen:
		case err := <-done:
			if err != nil {
				return nil, err
			}
			done = nil // it read every output; the last is in seen
			j = <-seen
		}
		if j != i {
			return nil, fmt.Errorf("output %d arrived while waiting for %d", j, i)
		}
		out = append(out, time.Duration(arr.at[i].Load()-committed))
	}
	if done != nil {
		return out, <-done
	}
	return out, nil
}

func medianF(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func pct(v []time.Duration, q float64) time.Duration {
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(q*float64(len(s)-1))]
}
