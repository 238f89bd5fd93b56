package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/examples/internal/exampletest"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

// exampleEnv is the example's configuration for a test: the test's Redis, a free
// port for /metrics, and names that hold the run's id.
func exampleEnv(t *testing.T, prefix string) []string {
	return []string{"REDIS_ADDR=" + testenv.Service(t, "REDIS_ADDR"), "METRICS_ADDR=127.0.0.1:0", "PREFIX=" + prefix}
}

// deleteAll deletes, when the test ends, every key the example made:
// its streams, leases and ledger.
func deleteAll(t *testing.T, client *redis.Client, prefix string) {
	t.Cleanup(func() {
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("deleting the example's keys: %v", err)
		}
	})
}

// ledgerEntries reads the ledger as Redis has it: each order's charges
// and the fencing token of the last one.
func ledgerEntries(t *testing.T, client *redis.Client, prefix string) map[string]entry {
	t.Helper()
	ctx := context.Background()
	out := map[string]entry{}
	keys, err := client.Keys(ctx, prefix+"ledger:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range keys {
		h, err := client.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		token, _ := strconv.ParseInt(h["token"], 10, 64)
		charges, _ := strconv.ParseInt(h["charges"], 10, 64)
		out[key[len(prefix+"ledger:"):]] = entry{Token: token, Charges: charges}
	}
	return out
}

// The demo as a user runs it (`make example-redis`): the program exits 0
// with its verdict last, and Redis holds what it claims: every order
// charged once, its lease completed under the token the ledger kept, and
// only the message without an order id on the poison stream.
func TestRedisStreamsExample(t *testing.T) {
	bin := exampletest.Build(t, ".")
	client := testenv.RedisClient(t)
	prefix := testenv.Unique("example-redis-")
	deleteAll(t, client, prefix)

	p := exampletest.Start(t, "the redis example", bin, nil, exampleEnv(t, prefix)...)
	if code := p.Wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	summary, err := exampletest.ParseSummary(p.Output(), "Check: 22 orders charged exactly once each")
	if err != nil {
		t.Fatal(err)
	}
	if p.Find(exampletest.MetricsURL) == nil {
		t.Error("the /metrics URL was not printed")
	}

	want := []string{slowOrder, flakyOrder}
	for i := range demoOrders {
		want = append(want, fmt.Sprintf("order-%03d", i+1))
	}
	ledger := ledgerEntries(t, client, prefix)
	if len(ledger) != len(want) {
		t.Errorf("the ledger holds %d orders, want %d: %v", len(ledger), len(want), ledger)
	}
	leases, err := redisstore.New(client, redisstore.Options{Prefix: prefix + "idem:"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range want {
		e := ledger[id]
		if e.Charges != 1 {
			t.Errorf("order %s charged %d times", id, e.Charges)
		}
		rec, err := leases.Inspect(context.Background(), "charge-order:"+id)
		if err != nil {
			t.Errorf("order %s's lease: %v", id, err)
			continue
		}
		if rec.State != backends.StateCompleted || rec.Token != e.Token {
			t.Errorf("order %s's lease is %s under token %d; the ledger's charge has token %d", id, rec.State, rec.Token, e.Token)
		}
	}
	poisoned := int(client.XLen(context.Background(), prefix+"orders.poison").Val())
	if poisoned != 1 {
		t.Errorf("the poison stream holds %d messages, want the one without an order id", poisoned)
	}

	// The summary's numbers are what Redis holds and what the program
	// logged.
	messages := int(client.XLen(context.Background(), prefix+"orders").Val())
	charges, attempts := 0, len(p.Lines(regexp.MustCompile(`msg=charging `)))
	for _, e := range ledger {
		charges += int(e.Charges)
	}
	e := exampletest.Expect{Summary: summary}
	e.Total("messages on the orders stream", messages)
	e.Part("messages on the orders stream", "orders", len(want))
	e.Part("messages on the orders stream", "second copies", demoOrders)
	e.Part("messages on the orders stream", "without an order id", 1)
	e.Part("deliveries to the router", "messages", messages)
	e.Part("the same deliveries by outcome", "processed", len(want))
	e.Part("the same deliveries by outcome", "key_error", poisoned)
	e.That(e.Value("the same deliveries by outcome", "duplicate") >= demoOrders, "fewer duplicates than second copies")
	e.That(e.Value("the same deliveries by outcome", "handler_failed") >= 1, "no failed delivery: the flaky order's")
	e.Total("charge attempts", attempts)
	e.Part("charge attempts", "charges in the ledger", charges)
	e.Part("charge attempts", "failed", attempts-charges)
	e.Total("charges in the ledger", charges)
	e.Part("charges in the ledger", "orders charged", len(ledger))
	e.Part("charges in the ledger", "charges of an order charged before", 0)
	e.Total("messages on the poison stream", poisoned)
	if err := e.Err(); err != nil {
		t.Error(err)
	}
}

var (
	consuming = regexp.MustCompile(`msg=consuming `)
	charging  = func(order string) *regexp.Regexp {
		return regexp.MustCompile(`msg=charging order=` + order + ` .*fencing_token=(\d+)`)
	}
)

// Two copies of the service share the stream and the leases, as two
// instances of a deployment would. While one charges the slow order,
// Redis Streams hands its idle entry to a consumer again, which waits for
// the holder. Then the copy charging another slow order is killed
// (SIGKILL): the survivor claims the entry, takes the dead copy's lease
// over once it has run out, and charges the order under a newer fencing
// token. Every order is charged once, and the survivor shuts down
// gracefully on SIGTERM.
func TestRedisStreamsExampleCopies(t *testing.T) {
	bin := exampletest.Build(t, ".")
	client := testenv.RedisClient(t)
	prefix := testenv.Unique("example-redis-copies-")
	deleteAll(t, client, prefix)

	copies := []*exampletest.Process{
		exampletest.Start(t, "copy a", bin, []string{"-serve"}, exampleEnv(t, prefix)...),
		exampletest.Start(t, "copy b", bin, []string{"-serve"}, exampleEnv(t, prefix)...),
	}
	for _, p := range copies {
		p.WaitFor(consuming, time.Minute)
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	send := func(o order) {
		t.Helper()
		payload, _ := json.Marshal(o)
		if err := pub.Publish(prefix+"orders", message.NewMessage(watermill.NewUUID(), payload)); err != nil {
			t.Fatal(err)
		}
	}

	send(order{ID: slowOrder, AmountCents: 5000, Simulate: "slow"})
	exampletest.WaitForAny(t, copies, regexp.MustCompile(`msg=delivery outcome=duplicate key=charge-order:`+slowOrder+` .*waited=`), time.Minute)

	const crashOrder = "order-crash"
	send(order{ID: crashOrder, AmountCents: 6000, Simulate: "slow"})
	holder, m := exampletest.WaitForAny(t, copies, charging(crashOrder), time.Minute)
	deadToken, _ := strconv.ParseInt(m[1], 10, 64)
	holder.Kill()
	survivor := copies[0]
	if survivor == holder {
		survivor = copies[1]
	}
	m = survivor.WaitFor(regexp.MustCompile(`msg=delivery outcome=processed key=charge-order:`+crashOrder+` .*fencing_token=(\d+) takeover=true`), time.Minute)
	takeoverToken, _ := strconv.ParseInt(m[1], 10, 64)
	if takeoverToken <= deadToken {
		t.Errorf("the survivor charged the crash order under token %d, the dead copy held %d", takeoverToken, deadToken)
	}

	want := []string{slowOrder, crashOrder}
	for i := range 10 {
		o := order{ID: fmt.Sprintf("order-%03d", i+1), AmountCents: 100}
		send(o)
		send(o)
		want = append(want, o.ID)
	}
	deadline := time.Now().Add(time.Minute)
	for len(ledgerEntries(t, client, prefix)) < len(want) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	ledger := ledgerEntries(t, client, prefix)
	for _, id := range want {
		if ledger[id].Charges != 1 {
			t.Errorf("order %s charged %d times", id, ledger[id].Charges)
		}
	}
	if ledger[crashOrder].Token != takeoverToken {
		t.Errorf("the ledger kept token %d for the crash order, the takeover's was %d", ledger[crashOrder].Token, takeoverToken)
	}

	// What an operator sees: the takeover on the survivor's /metrics.
	families := exampletest.Scrape(t, survivor.WaitFor(exampletest.MetricsURL, time.Second)[1])
	if n := exampletest.Sum(families, "watermill_idempotency_takeovers_total", "")[""]; n < 1 {
		t.Errorf("the survivor's /metrics counts %v takeovers", n)
	}
	survivor.Signal(syscall.SIGTERM)
	if code := survivor.Wait(time.Minute); code != 0 {
		t.Errorf("the survivor exited with status %d after SIGTERM", code)
	}
	if survivor.Find(regexp.MustCompile(`msg="shut down: no handler running"`)) == nil {
		t.Error("the survivor did not report its graceful shutdown")
	}
	if n := client.XLen(context.Background(), prefix+"orders.poison").Val(); n != 0 {
		t.Errorf("%d messages reached the poison stream", n)
	}
}
