package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/examples/internal/exampletest"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

// prefixFor returns a prefix for the example's streams and tables: short
// (Postgres names end at 63 bytes), made of what Postgres takes unquoted,
// and holding the run's id ($IDEM_TEST_RUN), by which make test finds the
// run's keys on a Redis the user shares.
func prefixFor(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, strings.ToLower(fmt.Sprintf("%s%s_%d_", name, os.Getenv("IDEM_TEST_RUN"), time.Now().UnixNano()%1e9)))
}

// setup returns the example's configuration for a test, and drops the
// example's tables and streams when the test ends.
func setup(t *testing.T, prefix string) (*pgxpool.Pool, *redis.Client, []string) {
	pool := testenv.PostgresPool(t)
	client := testenv.RedisClient(t)
	n := namesFor(prefix)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+n.charges+`, `+n.keys+`, "watermill_`+n.outbox+`", "watermill_offsets_`+n.outbox+`"`)
		client.Del(ctx, n.orders, n.receipts)
	})
	return pool, client, []string{
		"DATABASE_URL=" + testenv.Service(t, "TEST_DATABASE_URL"),
		"REDIS_ADDR=" + testenv.Service(t, "REDIS_ADDR"),
		"PREFIX=" + prefix,
	}
}

// The demo as a user runs it (`make example-outbox`): the program exits 0
// with its verdict last, and its summary is what Postgres and Redis hold.
func TestOutboxExample(t *testing.T) {
	bin := exampletest.Build(t, ".")
	prefix := prefixFor("ex_")
	pool, client, env := setup(t, prefix)
	n := namesFor(prefix)
	p := exampletest.Start(t, "the outbox example", bin, nil, env...)
	if code := p.Wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	summary, err := exampletest.ParseSummary(p.Output(), "Check: 20 orders charged exactly once each")
	if err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	count := func(sql string) int {
		var c int
		if err := pool.QueryRow(ctx, sql).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	receipts := map[string]bool{}
	entries, err := client.XRange(ctx, n.receipts, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		id, _ := e.Values["_watermill_message_uuid"].(string)
		receipts[id] = true
	}
	e := exampletest.Expect{Summary: summary}
	e.Total("messages on the orders stream", int(client.XLen(ctx, n.orders).Val()))
	e.Part("messages on the orders stream", "orders", demoOrders)
	e.Part("messages on the orders stream", "second copies", demoOrders)
	e.Total("charge rows", count(`SELECT count(*) FROM `+n.charges))
	e.Part("charge rows", "orders charged", count(`SELECT count(DISTINCT order_id) FROM `+n.charges))
	e.Total("receipts in the outbox table", count(`SELECT count(*) FROM "watermill_`+n.outbox+`"`))
	e.Part("receipts in the outbox table", "receipts", count(`SELECT count(DISTINCT payload::json->>'uuid') FROM "watermill_`+n.outbox+`"`))
	e.Total("receipts on the receipts stream", len(entries))
	e.Part("receipts on the receipts stream", "receipts", len(receipts))
	e.Total("receipts applied downstream", demoOrders)
	if err := e.Err(); err != nil {
		t.Error(err)
	}
}

// Two copies of the service share the stream, the leases and the outbox.
// One is killed (SIGKILL) while it charges orders: whatever it had not
// committed is rolled back, and the survivor takes its orders over once
// their leases run out. Every order is charged once, its receipt is in the
// outbox once and reaches the receipts stream (at least once: the dead
// copy's Forwarder may have published a batch it had not yet marked).
func TestOutboxExampleCopyKilled(t *testing.T) {
	bin := exampletest.Build(t, ".")
	prefix := prefixFor("exk_")
	pool, client, env := setup(t, prefix)
	n := namesFor(prefix)

	a := exampletest.Start(t, "copy a", bin, []string{"-serve"}, env...)
	a.WaitFor(regexp.MustCompile(`msg=consuming `), time.Minute)
	b := exampletest.Start(t, "copy b", bin, []string{"-serve"}, env...)
	b.WaitFor(regexp.MustCompile(`msg=consuming `), time.Minute)

	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	const orders = 200
	for i := range orders {
		payload, _ := json.Marshal(order{ID: fmt.Sprintf("order-%03d", i+1), AmountCents: 100})
		for range 2 {
			if err := pub.Publish(n.orders, message.NewMessage(watermill.NewUUID(), payload)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Kill copy a once it has charged a few orders, in the middle of its
	// work.
	charging := regexp.MustCompile(`msg=charging `)
	for start := time.Now(); len(a.Lines(charging)) < 10; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > time.Minute {
			t.Fatal("copy a charged fewer than 10 orders in a minute")
		}
	}
	a.Kill()

	ctx := context.Background()
	count := func(sql string) int {
		var c int
		if err := pool.QueryRow(ctx, sql).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		stream := map[string]bool{}
		entries, err := client.XRange(ctx, n.receipts, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if id, ok := e.Values["_watermill_message_uuid"].(string); ok {
				stream[id] = true
			}
		}
		if len(stream) == orders {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d receipts reached the stream in 2 minutes", len(stream), orders)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if c := count(`SELECT count(*) FROM (SELECT order_id FROM ` + n.charges + ` GROUP BY order_id HAVING count(*) = 1) once`); c != orders {
		t.Errorf("%d of %d orders charged exactly once", c, orders)
	}
	if c := count(`SELECT count(*) FROM ` + n.charges); c != orders {
		t.Errorf("%d charge rows for %d orders", c, orders)
	}
	if c := count(`SELECT count(DISTINCT payload::json->>'uuid') FROM "watermill_` + n.outbox + `"`); c != orders {
		t.Errorf("%d distinct receipts in the outbox, want %d", c, orders)
	}
	if c := count(`SELECT count(*) FROM "watermill_` + n.outbox + `"`); c != orders {
		t.Errorf("%d outbox rows, want %d", c, orders)
	}
	b.Signal(syscall.SIGTERM)
	if code := b.Wait(time.Minute); code != 0 {
		t.Errorf("the survivor exited with status %d after SIGTERM", code)
	}
}
