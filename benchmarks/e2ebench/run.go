package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// env is what every run of one benchmark shares.
type env struct {
	cfg   config
	redis *redis.Client // publishing, INFO, cleaning up
	// meters of the stores' servers; nil when the server is not on this
	// machine (noMeter says why).
	meters  map[server]meter
	noMeter map[server]error
}

// name is a name on a server for this benchmark, its run and parts.
func (e *env) name(parts ...string) string {
	return strings.Join(append([]string{"e2ebench", e.cfg.runID}, parts...), ":")
}

// sqlName makes name a SQL identifier.
func sqlName(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r - 'A' + 'a'
		}
		return '_'
	}, name)
}

// deleteKeys deletes the keys matching pattern from the stream's Redis.
func (e *env) deleteKeys(pattern string) {
	ctx := context.Background()
	iter := e.redis.Scan(ctx, 0, pattern, 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 1000 {
			e.redis.Del(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		e.redis.Del(ctx, keys...)
	}
}

// workload is one round's messages: the distinct keys, and the order in
// which they are published, duplicates included.
type workload struct {
	uuids  []string
	order  []int32 // indexes into uuids
	copies []int32 // how often each key is published
	index  map[string]int32
}

// newWorkload publishes n messages of which a fraction dup repeat an
// earlier message's UUID, each after its original and before the original
// spread keys later.
// Which keys repeat, and where, is the same for a given round.
func newWorkload(n int, dup float64, spread, round int) *workload {
	dups := duplicateCount(n, dup)
	distinct := n - dups
	w := &workload{
		uuids:  make([]string, distinct),
		copies: make([]int32, distinct),
		index:  make(map[string]int32, distinct),
	}
	type entry struct {
		pos float64
		key int32
	}
	entries := make([]entry, 0, n)
	for i := range distinct {
		w.uuids[i] = watermill.NewUUID()
		w.index[w.uuids[i]] = int32(i)
		entries = append(entries, entry{pos: float64(i), key: int32(i)})
	}
	rnd := rand.New(rand.NewPCG(uint64(round), 0x5eed))
	for range dups {
		key := rnd.IntN(distinct)
		// A key's copies come after it: 0.5 sorts a duplicate between two
		// originals.
		entries = append(entries, entry{pos: float64(key+rnd.IntN(spread)) + 0.5, key: int32(key)})
	}
	slices.SortStableFunc(entries, func(a, b entry) int {
		switch {
		case a.pos < b.pos:
			return -1
		case a.pos > b.pos:
			return 1
		}
		return 0
	})
	w.order = make([]int32, n)
	for i, e := range entries {
		w.order[i] = e.key
		w.copies[e.key]++
	}
	return w
}

// duplicateCount is how many of n messages repeat an earlier one: at
// least one is not a duplicate.
func duplicateCount(n int, dup float64) int { return min(int(float64(n)*dup+0.5), n-1) }

// publish appends the workload to stream as a redisstream publisher
// would, one XADD per message with its marshaller, pipelined: publishing
// is not measured.
func (e *env) publish(ctx context.Context, w *workload, stream string) error {
	var m redisstream.DefaultMarshallerUnmarshaller
	const batch = 1000
	for start := 0; start < len(w.order); start += batch {
		pipe := e.redis.Pipeline()
		for _, key := range w.order[start:min(start+batch, len(w.order))] {
			id := w.uuids[key]
			msg := message.NewMessage(id, fmt.Appendf(nil, `{"order_id":%q,"amount_cents":%d}`, id, 100+key%9900))
			values, err := m.Marshal(stream, msg)
			if err != nil {
				return err
			}
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("publishing: %w", err)
		}
	}
	return nil
}

// measurement is one run of one variant.
type measurement struct {
	elapsed    time.Duration
	client     time.Duration // this process's CPU
	redis      time.Duration // the Redis server's CPU
	store      time.Duration // the store's server's CPU, if it has one
	storeKnown bool
	commands   commandStats // the commands Redis ran
	nacks      int64        // deliveries that failed and came back
	// With this middleware: deliveries dropped as duplicates, and
	// deliveries that waited for another's lease on their key.
	duplicates, waited int64
	// once is nil if every key ran the handler exactly once.
	once error
	// copies is nil if every key ran the handler as often as it was
	// published.
	copies error
}

// runOnce publishes a fresh stream and consumes it through variant v.
// Rounds count from 0; the warm-up is round -1.
func (e *env) runOnce(ctx context.Context, v variant, w *workload, round int) (measurement, error) {
	id := fmt.Sprintf("r%d:%s", round+1, v.name)
	stream := e.name(id, "orders")
	defer e.redis.Del(context.Background(), stream)
	if err := e.publish(ctx, w, stream); err != nil {
		return measurement{}, err
	}
	var counters idempotency.Counters
	mw, undo, err := v.setup(ctx, e, id, &counters)
	if err != nil {
		return measurement{}, fmt.Errorf("%s: %w", v.name, err)
	}
	defer undo()

	// The router: the counting middleware outermost, then the variant's,
	// and one handler per consumer, each with a subscriber of its own in
	// one consumer group, as examples/redis sets them up.
	logger := watermill.NopLogger{}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return measurement{}, err
	}
	total := int64(len(w.order))
	var acked, nacks atomic.Int64
	done := make(chan struct{})
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				nacks.Add(1)
				return out, err
			}
			if acked.Add(1) == total {
				close(done)
			}
			return out, nil
		}
	})
	if mw != nil {
		router.AddMiddleware(mw)
	}
	runs := make([]atomic.Int32, len(w.uuids))
	var strangers atomic.Int64
	handler := func(msg *message.Message) error {
		i, ok := w.index[msg.UUID]
		if !ok {
			strangers.Add(1)
			return nil
		}
		runs[i].Add(1)
		return nil
	}
	for i := range e.cfg.consumers {
		sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client:        redis.NewClient(&redis.Options{Addr: e.cfg.redisAddr}), // the subscriber closes it
			Consumer:      fmt.Sprintf("consumer-%d", i),
			ConsumerGroup: "orders",
			// So that closing the router does not wait on an empty stream.
			DisableIndefiniteInitialBlock: true,
		}, logger)
		if err != nil {
			return measurement{}, err
		}
		router.AddConsumerHandler(fmt.Sprintf("orders-%d", i), stream, sub, handler)
	}

	// What ran before (publishing, the previous run's garbage) is not
	// this run's.
	runtime.GC()
	before, err := e.sample(ctx, v, false)
	if err != nil {
		return measurement{}, err
	}
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()

	waitErr := e.wait(ctx, done, &acked, total, runErr)
	elapsed := time.Since(start)
	after, err := e.sample(ctx, v, true)
	closeErr := router.Close()
	if waitErr != nil {
		return measurement{}, waitErr
	}
	if err != nil {
		return measurement{}, err
	}
	if closeErr != nil {
		return measurement{}, closeErr
	}
	if err := <-runErr; err != nil {
		return measurement{}, err
	}
	if n := strangers.Load(); n > 0 {
		return measurement{}, fmt.Errorf("%d messages this run did not publish", n)
	}
	m := measurement{
		elapsed:    elapsed,
		client:     after.client - before.client,
		redis:      after.redis - before.redis,
		store:      after.store - before.store,
		storeKnown: after.storeKnown,
		commands:   after.commands.minus(before.commands),
		nacks:      nacks.Load(),
		duplicates: counters.Count(idempotency.OutcomeDuplicate),
		waited:     counters.Waited(),
	}
	m.once, m.copies = check(w, runs)
	return m, nil
}

// wait returns when every message has been acked, or with an error when
// none has been for the stall time, the router stopped, or ctx ended.
func (e *env) wait(ctx context.Context, done <-chan struct{}, acked *atomic.Int64, total int64, runErr <-chan error) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, lastChange := acked.Load(), time.Now()
	for {
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case err := <-runErr:
			return fmt.Errorf("the router stopped after %d of %d messages: %v", acked.Load(), total, err)
		case now := <-tick.C:
			if n := acked.Load(); n != last {
				last, lastChange = n, now
			} else if now.Sub(lastChange) >= e.cfg.stall {
				return fmt.Errorf("no message acked for %v: %d of %d acked", e.cfg.stall, n, total)
			}
		}
	}
}

// sample is the CPU used so far by this process and the servers.
type sample struct {
	client, redis, store time.Duration
	storeKnown           bool
	commands             commandStats // Redis's, INFO commandstats
}

// sample reads the meters: this process's last at the start and first at
// the end, so that reading the servers' is outside the window.
func (e *env) sample(ctx context.Context, v variant, end bool) (sample, error) {
	var s sample
	var err error
	if end {
		if s.client, err = selfCPU(ctx); err != nil {
			return s, err
		}
	} else if s.commands, err = redisCommands(ctx, e.redis); err != nil {
		return s, err
	}
	if s.redis, err = redisCPU(e.redis)(ctx); err != nil {
		return s, err
	}
	if m := e.meters[v.server]; m != nil {
		if s.store, err = m(ctx); err != nil {
			return s, err
		}
		s.storeKnown = true
	}
	if !end {
		if s.client, err = selfCPU(ctx); err != nil {
			return s, err
		}
	} else if s.commands, err = redisCommands(ctx, e.redis); err != nil {
		return s, err
	}
	return s, nil
}

// check compares the handler's runs per key with what was published:
// once reports keys run more than once or not at all, copies keys run
// other than once per copy.
func check(w *workload, runs []atomic.Int32) (once, copies error) {
	var twice, lost, notPerCopy int
	example := [3]string{}
	for i := range runs {
		n := runs[i].Load()
		switch {
		case n > 1:
			twice++
			example[0] = fmt.Sprintf("%s ran %d times", w.uuids[i], n)
		case n == 0:
			lost++
			example[1] = fmt.Sprintf("%s never ran", w.uuids[i])
		}
		if n != w.copies[i] {
			notPerCopy++
			example[2] = fmt.Sprintf("%s ran %d times, published %d", w.uuids[i], n, w.copies[i])
		}
	}
	var wrong []string
	if twice > 0 {
		wrong = append(wrong, fmt.Sprintf("%d of %d keys ran more than once (%s)", twice, len(runs), example[0]))
	}
	if lost > 0 {
		wrong = append(wrong, fmt.Sprintf("%d of %d keys never ran (%s)", lost, len(runs), example[1]))
	}
	if len(wrong) > 0 {
		once = errors.New(strings.Join(wrong, "; "))
	}
	if notPerCopy > 0 {
		copies = fmt.Errorf("%d of %d keys ran other than once per copy (%s)", notPerCopy, len(runs), example[2])
	}
	return once, copies
}

// result is one variant's figures over the rounds.
type result struct {
	variant variant
	runs    []measurement
}

// run runs the benchmark and prints its table to out, its progress to log.
func run(ctx context.Context, cfg config, out, log io.Writer) ([]result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.runID == "" {
		cfg.runID = os.Getenv("IDEM_TEST_RUN")
	}
	if cfg.runID == "" {
		cfg.runID = strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	e := &env{
		cfg:     cfg,
		redis:   redis.NewClient(&redis.Options{Addr: cfg.redisAddr}),
		meters:  map[server]meter{},
		noMeter: map[server]error{},
	}
	defer e.redis.Close()
	defer e.deleteKeys(e.name("*"))
	versions, err := e.prepare(ctx)
	if err != nil {
		return nil, err
	}

	results := make([]result, len(cfg.variants))
	steps := make([]func() error, len(cfg.variants))
	var w *workload
	round := 0
	for i, name := range cfg.variants {
		v, _ := lookupVariant(name)
		results[i].variant = v
		steps[i] = func() error {
			m, err := e.runOnce(ctx, v, w, round)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, v.name, err)
			}
			results[i].runs = append(results[i].runs, m)
			store := ""
			if m.storeKnown {
				store = fmt.Sprintf("  store server %6.1f µs/msg", perMsg(m.store, len(w.order)))
			}
			fmt.Fprintf(log, "round %d  %-12s  %8.0f msg/s  client %6.1f µs/msg  Redis %6.1f µs/msg%s\n",
				round+1, v.name, float64(len(w.order))/m.elapsed.Seconds(), perMsg(m.client, len(w.order)), perMsg(m.redis, len(w.order)), store)
			if v.once && m.once != nil {
				return fmt.Errorf("round %d, %s: not once per key: %w", round+1, v.name, m.once)
			}
			return nil
		}
	}
	// A first run in a process is slower than the next (connections,
	// the stream's and the runtime's first allocations): one on a tenth
	// of the messages, not counted, goes before the rounds.
	warmUp, _ := lookupVariant(cfg.variants[0])
	if _, err := e.runOnce(ctx, warmUp, newWorkload(max(1, cfg.messages/10), cfg.duplicates, cfg.spread, -1), -1); err != nil {
		return nil, fmt.Errorf("warming up: %w", err)
	}
	// One workload per round, the same for every variant in it; the
	// order of the variants rotates each round, so that none always
	// follows another.
	for round = range cfg.rounds {
		w = newWorkload(cfg.messages, cfg.duplicates, cfg.spread, round)
		for i := range steps {
			if err := steps[(i+round)%len(steps)](); err != nil {
				return results, err
			}
		}
	}
	printTable(out, e, versions, results)
	return results, nil
}

// prepare checks the servers the variants need, finds the meters of
// their CPU and returns their versions.
func (e *env) prepare(ctx context.Context) ([]string, error) {
	info, err := e.redis.Info(ctx, "server").Result()
	if err != nil {
		return nil, fmt.Errorf("redis at %s: %w", e.cfg.redisAddr, err)
	}
	versions := []string{"Redis " + infoField(info, "redis_version")}
	if _, err := redisCPU(e.redis)(ctx); err != nil {
		return nil, err
	}
	for _, name := range e.cfg.variants {
		v, _ := lookupVariant(name)
		switch v.server {
		case postgresServer:
			if e.cfg.pgURL == "" {
				return nil, errors.New("pgstore needs -pg")
			}
			var version string
			if err := queryPostgres(ctx, e.cfg.pgURL, "SHOW server_version", &version); err != nil {
				return nil, fmt.Errorf("postgres: %w", err)
			}
			versions = append(versions, "PostgreSQL "+version)
			if e.meters[postgresServer], err = postgresCPU(ctx, e.cfg.pgURL); err != nil {
				e.noMeter[postgresServer] = fmt.Errorf("the Postgres server's CPU is not measured: %w", err)
			}
		case mariadbServer:
			if e.cfg.mysqlDSN == "" {
				return nil, errors.New("mysqlstore needs -mysql")
			}
			db, err := sql.Open("mysql", e.cfg.mysqlDSN)
			if err != nil {
				return nil, err
			}
			var version string
			if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
				db.Close()
				return nil, fmt.Errorf("mysql: %w", err)
			}
			versions = append(versions, "MariaDB/MySQL "+version)
			if e.meters[mariadbServer], err = mariadbCPU(ctx, db); err != nil {
				e.noMeter[mariadbServer] = fmt.Errorf("the MariaDB server's CPU is not measured: %w", err)
			}
			db.Close()
		}
	}
	return versions, nil
}

func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return "?"
}

// queryPostgres scans the one value query returns into dest.
func queryPostgres(ctx context.Context, url, query string, dest any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, query).Scan(dest)
}

func perMsg(d time.Duration, n int) float64 { return float64(d.Microseconds()) / float64(n) }
