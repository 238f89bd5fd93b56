// Command outboxbench measures what the transactional outbox
// (contrib/sqloutbox) costs per message against the plain path, on
// Postgres with Redis Streams as the broker, in one run:
//
//   - plain: the handler writes its row and completes the key with its
//     output in its own transaction (pgstore's CompleteTx); the output is
//     then published to the broker, as the router does after the handler
//     returns;
//   - outbox: the handler writes its row and its output into the outbox
//     table in its transaction (sqloutbox's Handler); a Forwarder publishes
//     it to the broker.
//
// For each: the statements sent to Postgres per message (counted by a pgx
// tracer, the Forwarder's included), the throughput from 16 goroutines
// until every output is on the broker, and one caller's latency from the
// delivery to its output on the broker. Rounds of the two paths
// interleave; medians are printed.
//
// The Forwarder polls the outbox table when it found nothing: the outbox
// path runs with the default poll interval and again with 10 ms.
//
// Usage: go run ./outboxbench -url postgres://... -redis 127.0.0.1:6379
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

var (
	url       = flag.String("url", "", "Postgres URL")
	redisAddr = flag.String("redis", "", "Redis address (the broker)")
	messages  = flag.Int("n", 2000, "messages per throughput round")
	rounds    = flag.Int("rounds", 3, "rounds of each path")
	latencyN  = flag.Int("latency", 200, "messages per latency round")
	workers   = flag.Int("workers", 16, "goroutines for throughput")
)

// counter counts the statements a pool sends.
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type env struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	stmts   *counter
	store   *pgstore.Store
	outbox  *sqloutbox.Postgres // the Forwarder polls every DefaultPollInterval
	fast    *sqloutbox.Postgres // the same outbox, its Forwarder polling every 10 ms
	rdb     *redis.Client
	pub     message.Publisher
	prefix  string
	charges string
}

func main() {
	flag.Parse()
	if *url == "" || *redisAddr == "" {
		fmt.Fprintln(os.Stderr, "usage: outboxbench -url POSTGRES_URL -redis REDIS_ADDR")
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "outboxbench:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(*url)
	if err != nil {
		return err
	}
	stmts := &counter{}
	cfg.ConnConfig.Tracer = stmts
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	prefix := fmt.Sprintf("ob%d_", time.Now().UnixNano()%1e9)
	e := &env{ctx: ctx, pool: pool, stmts: stmts, prefix: prefix, charges: prefix + "charges"}
	if e.store, err = pgstore.New(pool, pgstore.Options{Table: prefix + "keys"}); err != nil {
		return err
	}
	if err := e.store.Migrate(ctx); err != nil {
		return err
	}
	if e.outbox, err = sqloutbox.NewPostgres(pool, e.store, sqloutbox.Options{Topic: prefix + "outbox"}); err != nil {
		return err
	}
	if e.fast, err = sqloutbox.NewPostgres(pool, e.store, sqloutbox.Options{Topic: prefix + "outbox", PollInterval: 10 * time.Millisecond}); err != nil {
		return err
	}
	if err := e.outbox.Migrate(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+e.charges+` (order_id text NOT NULL, token bigint NOT NULL)`); err != nil {
		return err
	}
	defer func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+e.charges+`, `+prefix+`keys, "watermill_`+prefix+`outbox", "watermill_offsets_`+prefix+`outbox"`)
	}()
	e.rdb = redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: 64})
	defer e.rdb.Close()
	if e.pub, err = redisstream.NewPublisher(redisstream.PublisherConfig{Client: e.rdb}, watermill.NopLogger{}); err != nil {
		return err
	}
	defer func() {
		keys, _ := e.rdb.Keys(context.Background(), prefix+"*").Result()
		if len(keys) > 0 {
			e.rdb.Del(context.Background(), keys...)
		}
	}()

	paths := []path{e.plain(), e.withOutbox("outbox", e.outbox), e.withOutbox("outbox10", e.fast)}
	thr := map[string][]float64{}
	lat := map[string][]time.Duration{}
	per := map[string]float64{}
	for r := range *rounds {
		for _, p := range paths {
			tp, spm, err := e.throughput(p, fmt.Sprintf("%s-t%d", p.name, r))
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			thr[p.name] = append(thr[p.name], tp)
			per[p.name] = spm
			ls, err := e.latency(p, fmt.Sprintf("%s-l%d", p.name, r))
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			lat[p.name] = append(lat[p.name], ls...)
		}
	}
	fmt.Printf("outboxbench: %d rounds of each path, interleaved; %d messages from %d goroutines per throughput round; %d messages one at a time per latency round\n",
		*rounds, *messages, *workers, *latencyN)
	fmt.Printf("outbox: the Forwarder polls every %v (the default); outbox10: every 10 ms\n\n", sqloutbox.DefaultPollInterval)
	fmt.Printf("%-8s %22s %22s %16s %16s\n", "path", "statements/message", "messages/s (median)", "latency p50", "latency p90")
	for _, p := range paths {
		fmt.Printf("%-8s %22.2f %22.0f %16v %16v\n", p.name, per[p.name], medianF(thr[p.name]),
			pct(lat[p.name], 0.5).Round(10*time.Microsecond), pct(lat[p.name], 0.9).Round(10*time.Microsecond))
	}
	fmt.Println()
	for _, name := range []string{"outbox", "outbox10"} {
		fmt.Printf("%s/plain: statements %.2f×, throughput %.2f×, latency p50 %.2f×\n", name,
			per[name]/per["plain"], medianF(thr[name])/medianF(thr["plain"]),
			float64(pct(lat[name], 0.5))/float64(pct(lat["plain"], 0.5)))
	}
	return nil
}

// path is one way to handle a message: handle runs the middleware and
// the handler for msg, whose output goes to topic; forwarder, if set,
// moves outputs to the broker meanwhile.
type path struct {
	name   string
	handle func(msg *message.Message, topic string) error
	outbox *sqloutbox.Postgres // whose Forwarder runs meanwhile, if set
}

func (e *env) idem(ns string) *idempotency.Idempotency {
	idem, err := idempotency.New(idempotency.Config{Store: e.store, Key: keyfunc.Metadata("order"), Namespace: ns})
	if err != nil {
		panic(err) // the configuration is fixed above
	}
	return idem
}

func receipt(msg *message.Message) *message.Message {
	return message.NewMessage("receipt-"+msg.UUID, []byte(`{"order_id":"`+msg.Metadata.Get("order")+`","amount_cents":1000}`))
}

func (e *env) plain() path {
	idem := e.idem("plain")
	return path{name: "plain", handle: func(msg *message.Message, topic string) error {
		h := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			lease, _ := idempotency.LeaseFromContext(ctx)
			out := []*message.Message{receipt(msg)}
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it is a no-op
			if _, err := tx.Exec(ctx, `INSERT INTO `+e.charges+` VALUES ($1, $2)`, msg.Metadata.Get("order"), lease.Token); err != nil {
				return nil, err
			}
			if err := e.store.CompleteTx(ctx, tx, lease, out); err != nil {
				return nil, err
			}
			return out, tx.Commit(ctx)
		})
		out, err := h(msg)
		if err != nil {
			return err
		}
		// What the router does with the output.
		return e.pub.Publish(topic, out...)
	}}
}

func (e *env) withOutbox(name string, ob *sqloutbox.Postgres) path {
	idem := e.idem(name)
	var topic atomic.Value
	h := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return nil, ob.Handler(func(tx *sqloutbox.PgxTx, msg *message.Message) error {
			lease, _ := idempotency.LeaseFromContext(msg.Context())
			if _, err := tx.Exec(msg.Context(), `INSERT INTO `+e.charges+` VALUES ($1, $2)`, msg.Metadata.Get("order"), lease.Token); err != nil {
				return err
			}
			return tx.Publish(topic.Load().(string), receipt(msg))
		})(msg)
	})
	return path{name: name, outbox: ob, handle: func(msg *message.Message, t string) error {
		topic.Store(t)
		_, err := h(msg)
		return err
	}}
}

// startForwarder runs ob's Forwarder until the returned stop.
func (e *env) startForwarder(ob *sqloutbox.Postgres) (func(), error) {
	fwd, err := ob.NewForwarder(e.pub, nil, forwarder.Config{})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = fwd.Run(ctx) }()
	<-fwd.Running()
	return func() { cancel(); _ = fwd.Close(); <-done }, nil
}

func newMsg(round string, i int) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set("order", fmt.Sprintf("%s-%d", round, i))
	return msg
}

// throughput handles *messages fresh messages from *workers goroutines
// and returns messages per second until every output is on the broker,
// and the statements sent per message.
func (e *env) throughput(p path, round string) (float64, float64, error) {
	topic := e.prefix + round
	if p.outbox != nil {
		stop, err := e.startForwarder(p.outbox)
		if err != nil {
			return 0, 0, err
		}
		defer stop()
	}
	before := e.stmts.n.Load()
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	var wg sync.WaitGroup
	for range *workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1))
				if i > *messages {
					return
				}
				if err := p.handle(newMsg(round, i), topic); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, 0, firstErr
	}
	for e.rdb.XLen(e.ctx, topic).Val() < int64(*messages) {
		if time.Since(start) > 5*time.Minute {
			return 0, 0, fmt.Errorf("outputs not on the broker after 5 minutes")
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	// The Forwarder's statements are counted until its last offset is
	// stored; its idle polls after that are not.
	time.Sleep(50 * time.Millisecond)
	spm := float64(e.stmts.n.Load()-before) / float64(*messages)
	return float64(*messages) / elapsed.Seconds(), spm, nil
}

// latency handles *latencyN messages one at a time, each from its delivery
// to its output read from the broker.
func (e *env) latency(p path, round string) ([]time.Duration, error) {
	topic := e.prefix + round
	if p.outbox != nil {
		stop, err := e.startForwarder(p.outbox)
		if err != nil {
			return nil, err
		}
		defer stop()
	}
	last := "0"
	var out []time.Duration
	for i := range *latencyN {
		start := time.Now()
		if err := p.handle(newMsg(round, i), topic); err != nil {
			return nil, err
		}
		res, err := e.rdb.XRead(e.ctx, &redis.XReadArgs{Streams: []string{topic, last}, Count: 1, Block: 10 * time.Second}).Result()
		if err != nil {
			return nil, fmt.Errorf("reading the output: %w", err)
		}
		out = append(out, time.Since(start))
		last = res[0].Messages[0].ID
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
