package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/watermill-idempotency/idempotency/examples/internal/exampletest"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

// The demo as a user runs it (`make example-http`): the program exits 0
// with its verdict last, and its summary is what Postgres and Redis hold.
func TestHTTPExample(t *testing.T) {
	bin := exampletest.Build(t, ".")
	prefix := strings.ToLower(fmt.Sprintf("ex_http_%s_%d_", strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, os.Getenv("IDEM_TEST_RUN")), time.Now().UnixNano()%1e9))
	pool := testenv.PostgresPool(t)
	client := testenv.RedisClient(t)
	n := namesFor(prefix)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+n.orders+`, `+n.charges+`, `+n.keys+`, "watermill_`+n.outbox+`", "watermill_offsets_`+n.outbox+`"`)
		client.Del(ctx, n.placed)
	})
	p := exampletest.Start(t, "the http example", bin, nil,
		"DATABASE_URL="+testenv.Service(t, "TEST_DATABASE_URL"), "REDIS_ADDR="+testenv.Service(t, "REDIS_ADDR"), "PREFIX="+prefix)
	if code := p.Wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	summary, err := exampletest.ParseSummary(p.Output(), "Check: 12 keys, 12 orders created and charged exactly once each")
	if err != nil {
		t.Fatal(err)
	}

	// The summary's numbers are what the tables and the stream hold.
	ctx := context.Background()
	count := func(sql string) int {
		var c int
		if err := pool.QueryRow(ctx, sql).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	var e exampletest.Expect
	e.Summary = summary
	e.Total("order rows", count(`SELECT count(*) FROM `+n.orders))
	e.Part("order rows", "keys with an order", count(`SELECT count(DISTINCT idempotency_key) FROM `+n.orders))
	e.Total("charge rows", count(`SELECT count(*) FROM `+n.charges))
	e.Part("charge rows", "orders charged", count(`SELECT count(DISTINCT order_id) FROM `+n.charges))
	e.Total("OrderPlaced on the stream", int(client.XLen(ctx, n.placed).Val()))
	e.Part("requests answered or lost", "created (201)", 12)
	e.Part("requests answered or lost", "refused 422, a key reused for another order", 1)
	e.Part("requests answered or lost", "lost with the killed service", 1)
	e.That(e.Value("requests answered or lost", "replayed (201, Idempotent-Replayed: true)") >= 10, "the retries were replayed")
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
}
