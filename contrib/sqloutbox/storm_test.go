package sqloutbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/mysqloutbox"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// The storm: several worker processes (this test binary, run again with
// stormRole set) consume orders from a Redis stream, each order delivered
// twice under two UUIDs. A worker's handler writes a charge row and
// publishes two receipts through the outbox; every worker also runs a
// Forwarder that moves the receipts to a Redis stream downstream. The
// test kills workers with SIGKILL at random times, and each worker kills
// itself at random at every step of its work: after the lease is taken,
// after the charge row, after the outbox rows, between the completion and
// the commit, after the commit (before the ack), and in the Forwarder
// before and after publishing a receipt (before its offset is stored).
// Killed workers are started again. A downstream consumer with the
// idempotency middleware keyed by UUID applies each receipt.
//
// At the end: every order has exactly one charge row, every receipt is in
// the outbox table exactly once, none is missing, and the downstream
// consumer applied each exactly once.
const (
	stormRole   = "SQLOUTBOX_STORM_ROLE"
	stormOrders = 300
	stormCopies = 2 // deliveries of each order, under distinct UUIDs
	stormOuts   = 2 // receipts per order
	workers     = 3
)

func TestMain(m *testing.M) {
	if os.Getenv(stormRole) == "worker" {
		os.Exit(worker())
	}
	os.Exit(m.Run())
}

// stormEnv is what the test and its workers share, passed to the
// workers in the environment.
type stormEnv struct {
	Dialect    string  // "postgres" or "mysql"
	DB         string  // TEST_DATABASE_URL or MYSQL_DSN
	Redis      string  // REDIS_ADDR
	In         string  // the orders' stream
	Out        string  // the receipts' stream (downstream)
	Topic      string  // the outbox topic
	Charges    string  // the business table
	StoreTable string  // the idempotency store's table
	Crash      float64 // probability of a self-kill at each step
	// The downstream broker is out (every publish fails) between these
	// times, in Unix nanoseconds, if set.
	OutageFrom, OutageTo int64
}

func (e stormEnv) environ() []string {
	b, _ := json.Marshal(e)
	return append(os.Environ(), stormRole+"=worker", "SQLOUTBOX_STORM_ENV="+string(b))
}

// crash kills the process outright, with probability p.
func crash(p float64) {
	if rand.Float64() < p {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// worker is a consumer process of the storm: it runs until SIGTERM or
// until it is killed.
func worker() int {
	var e stormEnv
	if err := json.Unmarshal([]byte(os.Getenv("SQLOUTBOX_STORM_ENV")), &e); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := runWorker(ctx, e); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}

// crashingPublisher kills the process before or after publishing, at
// random: a Forwarder that dies with a receipt published and its offset
// not stored.
type crashingPublisher struct {
	message.Publisher
	p        float64
	from, to int64
}

func (c crashingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if now := time.Now().UnixNano(); now >= c.from && now < c.to {
		return errors.New("broker outage")
	}
	crash(c.p)
	err := c.Publisher.Publish(topic, msgs...)
	crash(c.p)
	return err
}

func runWorker(ctx context.Context, e stormEnv) error {
	logger := watermill.NopLogger{}
	rdb := redis.NewClient(&redis.Options{Addr: e.Redis})
	defer rdb.Close()
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:          rdb,
		ConsumerGroup:   "workers",
		Consumer:        fmt.Sprintf("w-%d-%d", os.Getpid(), time.Now().UnixNano()),
		OldestId:        "0",
		ClaimInterval:   200 * time.Millisecond,
		MaxIdleTime:     time.Second,
		NackResendSleep: 50 * time.Millisecond,
		BlockTime:       100 * time.Millisecond,
	}, logger)
	if err != nil {
		return err
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: rdb}, logger)
	if err != nil {
		return err
	}
	sqloutbox.SetBeforeCommit(func() { crash(e.Crash) })

	var (
		store   backends.Store
		handler message.NoPublishHandlerFunc
		fwd     *forwarder.Forwarder
	)
	receipts := func(order string) []*message.Message {
		var out []*message.Message
		for i := range stormOuts {
			out = append(out, message.NewMessage(fmt.Sprintf("receipt-%s-%d", order, i), []byte(order)))
		}
		return out
	}
	// Rarer in the Forwarder: a crash there forwards its whole batch again.
	out := crashingPublisher{Publisher: pub, p: e.Crash / 10, from: e.OutageFrom, to: e.OutageTo}
	switch e.Dialect {
	case "postgres":
		pool, err := pgxpool.New(ctx, e.DB)
		if err != nil {
			return err
		}
		defer pool.Close()
		s, err := pgstore.New(pool, pgstore.Options{Table: e.StoreTable})
		if err != nil {
			return err
		}
		ob, err := sqloutbox.NewPostgres(pool, s, sqloutbox.Options{Topic: e.Topic})
		if err != nil {
			return err
		}
		store = s
		handler = ob.Handler(func(tx *sqloutbox.PgxTx, msg *message.Message) error {
			order := msg.Metadata.Get("order")
			lease, _ := idempotency.LeaseFromContext(msg.Context())
			if _, err := tx.Exec(msg.Context(), `INSERT INTO `+e.Charges+` (order_id, token) VALUES ($1, $2)`, order, lease.Token); err != nil {
				return err
			}
			crash(e.Crash)
			if err := tx.Publish(e.Out, receipts(order)...); err != nil {
				return err
			}
			crash(e.Crash)
			return nil
		})
		if fwd, err = ob.NewForwarder(out, logger, forwarder.Config{}); err != nil {
			return err
		}
	case "mysql":
		db, err := sql.Open("mysql", e.DB)
		if err != nil {
			return err
		}
		defer db.Close()
		s, err := mysqlstore.New(db, mysqlstore.Options{Table: e.StoreTable})
		if err != nil {
			return err
		}
		ob, err := mysqloutbox.New(db, s, mysqloutbox.Options{Topic: e.Topic})
		if err != nil {
			return err
		}
		store = s
		handler = ob.Handler(func(tx *mysqloutbox.Tx, msg *message.Message) error {
			order := msg.Metadata.Get("order")
			lease, _ := idempotency.LeaseFromContext(msg.Context())
			if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+e.Charges+` (order_id, token) VALUES (?, ?)`, order, lease.Token); err != nil {
				return err
			}
			crash(e.Crash)
			if err := tx.Publish(e.Out, receipts(order)...); err != nil {
				return err
			}
			crash(e.Crash)
			return nil
		})
		if fwd, err = ob.NewForwarder(out, logger, forwarder.Config{}); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown dialect %q", e.Dialect)
	}

	idem, err := idempotency.New(idempotency.Config{
		Store:    store,
		Key:      keyfunc.Metadata("order"),
		LeaseTTL: time.Second,
		Logger:   logger,
	})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	h := router.AddConsumerHandler("charge", e.In, sub, handler)
	// After the handler committed and before the router acks.
	afterCommit := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			crash(e.Crash)
			out, err := next(msg)
			crash(e.Crash)
			return out, err
		}
	}
	h.AddMiddleware(afterCommit, idem.Middleware)

	errs := make(chan error, 2)
	go func() { errs <- router.Run(ctx) }()
	go func() { errs <- fwd.Run(ctx) }()
	<-ctx.Done()
	_ = fwd.Close()
	_ = router.Close()
	return nil
}

// storm runs the storm against the database of e and checks its claims.
// rows lists the outbox table's payloads; charges counts the charge rows
// per order; completed tells whether an order's key is completed.
func storm(t *testing.T, e stormEnv, during func(), rows func() [][]byte, charges func() map[string]int, completed func(order string) bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := watermill.NopLogger{}
	rdb := redis.NewClient(&redis.Options{Addr: e.Redis})
	t.Cleanup(func() {
		_ = rdb.Del(context.Background(), e.In, e.Out).Err()
		_ = rdb.Close()
	})

	// Downstream: the idempotency middleware keyed by UUID in front of a
	// handler that applies each receipt.
	var (
		mu         sync.Mutex
		applied    = map[string]int{}
		deliveries = map[string]int{}
	)
	down, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client: rdb, ConsumerGroup: "downstream", OldestId: "0",
		BlockTime: 100 * time.Millisecond,
	}, logger)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	downIdem, err := idempotency.New(idempotency.Config{Store: mem, Key: keyfunc.UUID(), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	h := router.AddConsumerHandler("apply", e.Out, down, func(msg *message.Message) error {
		mu.Lock()
		applied[msg.UUID]++
		mu.Unlock()
		return nil
	})
	h.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			mu.Lock()
			deliveries[msg.UUID]++
			mu.Unlock()
			return next(msg)
		}
	}, downIdem.Middleware)
	routerDone := make(chan struct{})
	go func() {
		defer close(routerDone)
		if err := router.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	defer func() { cancel(); <-routerDone }()

	// The orders, each twice under distinct UUIDs.
	in, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: rdb}, logger)
	if err != nil {
		t.Fatal(err)
	}
	for i := range stormOrders {
		for range stormCopies {
			msg := message.NewMessage(watermill.NewUUID(), nil)
			msg.Metadata.Set("order", fmt.Sprintf("o%d", i))
			if err := in.Publish(e.In, msg); err != nil {
				t.Fatal(err)
			}
		}
	}

	// The workers, killed and started again until every receipt has been
	// applied downstream.
	logs, err := os.CreateTemp("", "sqloutbox-storm-*.log")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(logs.Name())
	var (
		procMu  sync.Mutex
		procs   = make([]*exec.Cmd, workers)
		started atomic.Int64
		exited  atomic.Int64
		killed  atomic.Int64
	)
	stopping := make(chan struct{})
	// start starts worker i, unless the storm is stopping. It holds procMu
	// from the check to the record, so that the final kill, which closes
	// stopping under procMu, sees every worker ever started: a worker
	// started behind its back would run on and hold up the test.
	start := func(i int) *exec.Cmd {
		procMu.Lock()
		defer procMu.Unlock()
		select {
		case <-stopping:
			return nil
		default:
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = e.environ()
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Error(err)
			return nil
		}
		started.Add(1)
		procs[i] = cmd
		return cmd
	}
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				cmd := start(i)
				if cmd == nil {
					return
				}
				_ = cmd.Wait()
				exited.Add(1)
			}
		}()
	}
	if during != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			during()
		}()
	}
	wg.Add(1)
	go func() { // the outside killer
		defer wg.Done()
		for {
			select {
			case <-stopping:
				return
			case <-time.After(time.Duration(200+rand.IntN(800)) * time.Millisecond):
			}
			procMu.Lock()
			if p := procs[rand.IntN(workers)]; p != nil && p.Process != nil {
				if p.Process.Signal(syscall.SIGKILL) == nil {
					killed.Add(1)
				}
			}
			procMu.Unlock()
		}
	}()

	// Until every receipt is applied, or nothing more is for 30 s (a
	// receipt that never reaches the outbox is never applied).
	want := stormOrders * stormOuts
	last, lastAt := 0, time.Now()
	for {
		mu.Lock()
		n := len(applied)
		mu.Unlock()
		if n >= want {
			break
		}
		if n > last {
			last, lastAt = n, time.Now()
		}
		if time.Since(lastAt) > 30*time.Second {
			t.Errorf("%d of %d receipts applied downstream, none more for 30 s", n, want)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	procMu.Lock()
	close(stopping)
	for _, p := range procs {
		if p != nil && p.Process != nil {
			_ = p.Process.Signal(syscall.SIGKILL)
		}
	}
	procMu.Unlock()
	wg.Wait()
	// Anything still on its way downstream arrives now.
	time.Sleep(500 * time.Millisecond)
	t.Logf("%s: %d worker processes started, %d killed from outside, %d exits in all (the rest killed themselves at a step)",
		e.Dialect, started.Load(), killed.Load(), exited.Load())

	// The outbox: every receipt exactly once.
	inOutbox := map[string]int{}
	for _, payload := range rows() {
		var env struct {
			DestinationTopic string `json:"destination_topic"`
			UUID             string `json:"uuid"`
		}
		if err := json.Unmarshal(payload, &env); err != nil {
			t.Fatalf("outbox row %q: %v", payload, err)
		}
		if env.DestinationTopic != e.Out {
			t.Errorf("receipt %s bound for %q, want %q", env.UUID, env.DestinationTopic, e.Out)
		}
		inOutbox[env.UUID]++
	}
	ch := charges()
	var lost, dupOutbox, doubleCharged, uncharged, notCompleted, notApplied, twiceApplied, redelivered int
	for i := range stormOrders {
		order := fmt.Sprintf("o%d", i)
		switch n := ch[order]; {
		case n == 0:
			uncharged++
		case n > 1:
			doubleCharged++
			t.Errorf("order %s charged %d times", order, n)
		}
		if !completed(order) {
			notCompleted++
		}
		for j := range stormOuts {
			id := fmt.Sprintf("receipt-%s-%d", order, j)
			switch n := inOutbox[id]; {
			case n == 0:
				lost++
				t.Errorf("receipt %s is not in the outbox", id)
			case n > 1:
				dupOutbox++
				t.Errorf("receipt %s is in the outbox %d times", id, n)
			}
			mu.Lock()
			a, d := applied[id], deliveries[id]
			mu.Unlock()
			switch {
			case a == 0:
				notApplied++
				t.Errorf("receipt %s never applied downstream", id)
			case a > 1:
				twiceApplied++
				t.Errorf("receipt %s applied %d times downstream", id, a)
			}
			if d > 1 {
				redelivered += d - 1
			}
		}
	}
	if len(inOutbox) != want {
		t.Errorf("%d distinct messages in the outbox, want %d", len(inOutbox), want)
	}
	t.Logf("%s: %d orders, %d receipts: %d lost, %d duplicated in the outbox, %d orders charged twice, %d not charged, %d keys not completed; "+
		"downstream: %d never applied, %d applied twice, %d extra deliveries of a receipt (the Forwarder's at-least-once, dropped by the middleware)",
		e.Dialect, stormOrders, want, lost, dupOutbox, doubleCharged, uncharged, notCompleted, notApplied, twiceApplied, redelivered)
	if uncharged > 0 || notCompleted > 0 {
		t.Errorf("%d orders not charged, %d keys not completed", uncharged, notCompleted)
	}
	if t.Failed() {
		b, _ := os.ReadFile(logs.Name())
		if len(b) > 8000 {
			b = b[len(b)-8000:]
		}
		t.Logf("workers' output (tail):\n%s", b)
	}
}

// service returns the address of a server the tests use, from the
// environment variable name, and fails the test if it is not set: `make
// test` starts private servers and sets these.
func service(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set. Run the tests with `make test`, which starts private servers and sets it, "+
			"or set it to a server the tests may write to", name)
	}
	return v
}

// unique returns a name for this test's tables and streams, holding this
// run's id ($IDEM_TEST_RUN), made of letters, digits and underscores.
func unique(prefix string) string {
	s := fmt.Sprintf("%s_%s_%d_%d", prefix, os.Getenv("IDEM_TEST_RUN"), os.Getpid(), time.Now().UnixNano()%1e9)
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '_'
	}, s)
}

func TestStormPostgres(t *testing.T) {
	pgStorm(t, service(t, "TEST_DATABASE_URL"), nil)
}

// The same storm on a Postgres of the test's own, which crashes twice
// (immediate shutdown, then crash recovery) while the downstream broker is
// also out for 3 s.
func TestStormPostgresCrashAndBrokerOutage(t *testing.T) {
	pg := startPostgres(t)
	pgStorm(t, pg.url(), func(e *stormEnv) func() {
		now := time.Now()
		e.OutageFrom, e.OutageTo = now.Add(2*time.Second).UnixNano(), now.Add(5*time.Second).UnixNano()
		return func() {
			for i := range 2 {
				time.Sleep(2 * time.Second)
				pg.crash()
				t.Logf("Postgres crashed (immediate shutdown) and started again, %d of 2", i+1)
			}
		}
	})
}

// pgStorm runs the storm on the Postgres at url; setup, if set, changes
// the workers' environment and returns what to do during the storm.
func pgStorm(t *testing.T, url string, setup func(e *stormEnv) func()) {
	e := stormEnv{
		Dialect: "postgres", DB: url, Redis: service(t, "REDIS_ADDR"),
		In: unique("orders"), Out: unique("receipts"), Topic: unique("outbox"),
		Charges: unique("charges"), StoreTable: unique("keys"), Crash: 0.02,
	}
	var during func()
	if setup != nil {
		during = setup(&e)
	}
	ctx := context.Background()
	connect := func() (*pgxpool.Pool, *pgstore.Store) {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		store, err := pgstore.New(pool, pgstore.Options{Table: e.StoreTable})
		if err != nil {
			t.Fatal(err)
		}
		return pool, store
	}
	pool, store := connect()
	ob, err := sqloutbox.NewPostgres(pool, store, sqloutbox.Options{Topic: e.Topic})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+e.Charges+` (order_id text NOT NULL, token bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+e.Charges+`, `+e.StoreTable+`, "watermill_`+e.Topic+`", "watermill_offsets_`+e.Topic+`"`)
	})
	// The checks connect anew: the server may have restarted under the
	// first pool.
	var once sync.Once
	check := func() (*pgxpool.Pool, *pgstore.Store) {
		once.Do(func() { pool, store = connect() })
		return pool, store
	}
	storm(t, e, during,
		func() [][]byte {
			pool, _ := check()
			rows, err := pool.Query(ctx, `SELECT payload::text FROM "watermill_`+e.Topic+`"`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var out [][]byte
			for rows.Next() {
				var p string
				if err := rows.Scan(&p); err != nil {
					t.Fatal(err)
				}
				out = append(out, []byte(p))
			}
			return out
		},
		func() map[string]int {
			pool, _ := check()
			rows, err := pool.Query(ctx, `SELECT order_id, count(*) FROM `+e.Charges+` GROUP BY order_id`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			m := map[string]int{}
			for rows.Next() {
				var o string
				var n int
				if err := rows.Scan(&o, &n); err != nil {
					t.Fatal(err)
				}
				m[o] = n
			}
			return m
		},
		func(order string) bool {
			_, store := check()
			rec, err := store.Inspect(ctx, "charge:"+order)
			return err == nil && rec.State == backends.StateCompleted
		})
}

func TestStormMariaDB(t *testing.T) {
	cfg, err := mysql.ParseDSN(service(t, "MYSQL_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	e := stormEnv{
		Dialect: "mysql", DB: cfg.FormatDSN(), Redis: service(t, "REDIS_ADDR"),
		In: unique("orders"), Out: unique("receipts"), Topic: unique("outbox"),
		Charges: unique("charges"), StoreTable: unique("keys"), Crash: 0.02,
	}
	ctx := context.Background()
	db, err := sql.Open("mysql", e.DB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	store, err := mysqlstore.New(db, mysqlstore.Options{Table: e.StoreTable})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := mysqloutbox.New(db, store, mysqloutbox.Options{Topic: e.Topic})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+e.Charges+` (order_id VARCHAR(64) NOT NULL, token BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+e.Charges+", "+e.StoreTable+", `watermill_"+e.Topic+"`, `watermill_offsets_"+e.Topic+"`")
	})
	storm(t, e, nil,
		func() [][]byte {
			rows, err := db.QueryContext(ctx, "SELECT payload FROM `watermill_"+e.Topic+"`")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var out [][]byte
			for rows.Next() {
				var p []byte
				if err := rows.Scan(&p); err != nil {
					t.Fatal(err)
				}
				out = append(out, p)
			}
			return out
		},
		func() map[string]int {
			rows, err := db.QueryContext(ctx, `SELECT order_id, count(*) FROM `+e.Charges+` GROUP BY order_id`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			m := map[string]int{}
			for rows.Next() {
				var o string
				var n int
				if err := rows.Scan(&o, &n); err != nil {
					t.Fatal(err)
				}
				m[o] = n
			}
			return m
		},
		func(order string) bool {
			rec, err := store.Inspect(ctx, "charge:"+order)
			return err == nil && rec.State == backends.StateCompleted
		})
}
