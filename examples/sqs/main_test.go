package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/examples/internal/exampletest"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

// exampleEnv is the example's configuration for a test: the test's
// servers, a free port for /metrics, and names that hold the run's id.
func exampleEnv(t *testing.T, store, prefix string) []string {
	return []string{
		"SQS_ENDPOINT=" + testenv.Service(t, "SQS_ENDPOINT"),
		"AWS_REGION=us-east-1",
		"STORE=" + store,
		"REDIS_ADDR=" + testenv.Service(t, "REDIS_ADDR"),
		"DATABASE_URL=" + testenv.Service(t, "TEST_DATABASE_URL"),
		"DYNAMODB_ENDPOINT=" + testenv.Service(t, "DYNAMODB_ENDPOINT"),
		"DYNAMODB_TTL=untouched", // dynalite has no Time to Live
		"METRICS_ADDR=127.0.0.1:0",
		"PREFIX=" + prefix,
	}
}

// uniquePrefix is a PREFIX holding the run's id that names queues, tables,
// schemas and keys alike.
func uniquePrefix(name string) string {
	return strings.ReplaceAll(testenv.Unique(name), ":", "-")
}

// leaseStore opens the example's lease store as the test sees it, and
// removes, when the test ends, everything the example made: its queues,
// its Redis keys, and its schema or table.
func leaseStore(t *testing.T, store, prefix string) backends.Store {
	client := testenv.RedisClient(t)
	_, _, sqs := sqsClient(t)
	deleteQueues(t, sqs, prefix+"orders", prefix+"orders-poison")
	t.Cleanup(func() {
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
	})
	switch store {
	case "redis":
		s, err := redisstore.New(client, redisstore.Options{Prefix: prefix + "idem:"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	case "postgres":
		pool := testenv.PostgresPool(t)
		schema := postgresSchema(prefix)
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
		s, err := pgstore.New(pool, pgstore.Options{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	case "dynamodb":
		client := dynamodb.New(dynamodb.Options{
			Region:       "us-east-1",
			BaseEndpoint: aws.String(testenv.Service(t, "DYNAMODB_ENDPOINT")),
			Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		})
		table := prefix + "idem"
		t.Cleanup(func() {
			_, _ = client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
		})
		s, err := dynamostore.New(client, dynamostore.Options{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Fatalf("no store %s", store)
	return nil
}

// ledgerEntries reads the ledger as Redis has it.
func ledgerEntries(t *testing.T, prefix string) map[string]entry {
	t.Helper()
	l := &ledger{client: testenv.RedisClient(t), prefix: prefix + "ledger:"}
	entries, err := l.entries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

// deferred matches the line Defer logs for each copy it defers while its order is in progress.
var deferred = regexp.MustCompile(`msg="awssqs: in-progress message delayed until the holder's lease runs out"`)

// The demo as a user runs it (`make example-sqs`, `-store postgres`,
// `-store dynamodb`) on SQS ($SQS_ENDPOINT: goaws under `make test`): the
// program exits 0 with its verdict last, Defer logs the copies it
// deferred, and the stores hold what it claims: every order charged once,
// its lease completed under the token the ledger kept.
func TestSQSExample(t *testing.T) {
	bin := exampletest.Build(t, ".")
	for _, store := range []string{"redis", "postgres", "dynamodb"} {
		t.Run(store, func(t *testing.T) {
			prefix := uniquePrefix("example-sqs-")
			leases := leaseStore(t, store, prefix)
			p := exampletest.Start(t, "the sqs example", bin, nil, exampleEnv(t, store, prefix)...)
			if code := p.Wait(3 * time.Minute); code != 0 {
				t.Fatalf("exit status %d", code)
			}
			summary, err := exampletest.ParseSummary(p.Output(), "Check: 22 orders charged exactly once each")
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Lines(deferred)) < 1 {
				t.Error("Defer deferred no copy whose order was in progress")
			}
			want := []string{slowOrder, flakyOrder}
			for i := range demoOrders {
				want = append(want, fmt.Sprintf("order-%03d", i+1))
			}
			ledger := ledgerEntries(t, prefix)
			if len(ledger) != len(want) {
				t.Errorf("the ledger holds %d orders, want %d: %v", len(ledger), len(want), ledger)
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
			checkSummary(t, summary, ledger, len(p.Lines(regexp.MustCompile(`msg=charging `))))
		})
	}
}

// checkSummary checks the demo's summary against what it sent (the slow
// order and every ordinary order twice, the flaky order and a message
// without an order id once), the ledger, and its charging lines.
func checkSummary(t *testing.T, summary exampletest.Summary, ledger map[string]entry, attempts int) {
	t.Helper()
	orders, second := 2+demoOrders, 1+demoOrders
	messages := orders + second + 1
	charges := 0
	for _, e := range ledger {
		charges += int(e.Charges)
	}
	e := exampletest.Expect{Summary: summary}
	e.Total("messages sent to the orders queue", messages)
	e.Part("messages sent to the orders queue", "orders", len(ledger))
	e.Part("messages sent to the orders queue", "second copies", second)
	e.Part("messages sent to the orders queue", "without an order id", 1)
	e.Part("deliveries to the router", "messages", messages)
	e.Part("the same deliveries by outcome", "processed", len(ledger))
	e.Part("the same deliveries by outcome", "key_error", 1)
	e.That(e.Value("the same deliveries by outcome", "duplicate") >= second, "fewer duplicates than second copies")
	e.That(e.Value("the same deliveries by outcome", "in_progress") >= 1, "no delivery nacked in progress: the slow order's second copy")
	e.Total("charge attempts", attempts)
	e.Part("charge attempts", "charges in the ledger", charges)
	e.Part("charge attempts", "failed", attempts-charges)
	e.Total("charges in the ledger", charges)
	e.Part("charges in the ledger", "orders charged", orders)
	e.Part("charges in the ledger", "charges of an order charged before", 0)
	e.Total("messages on the poison queue", 1)
	if err := e.Err(); err != nil {
		t.Error(err)
	}
}

// Two copies of the service share the queue and the leases, as two
// instances of a deployment would. The copy charging a slow order is
// killed (SIGKILL): SQS shows the message again after the visibility
// timeout, the survivor's copy is deferred until the dead copy's lease has
// run out, then takes it over and charges the order under a newer fencing
// token. Every order is charged once, and the survivor shuts down
// gracefully on SIGTERM.
func TestSQSExampleCopies(t *testing.T) {
	bin := exampletest.Build(t, ".")
	prefix := uniquePrefix("example-sqs-copies-")
	leaseStore(t, "redis", prefix)
	copies := []*exampletest.Process{
		exampletest.Start(t, "copy a", bin, []string{"-serve"}, exampleEnv(t, "redis", prefix)...),
		exampletest.Start(t, "copy b", bin, []string{"-serve"}, exampleEnv(t, "redis", prefix)...),
	}
	for _, p := range copies {
		p.WaitFor(regexp.MustCompile(`msg=consuming `), time.Minute)
	}
	awsCfg, endpoint, _ := sqsClient(t)
	pub, err := wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: awsCfg, OptFns: endpoint, DoNotCreateQueueIfNotExists: true}, watermill.NopLogger{})
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

	const crashOrder = "order-crash"
	send(order{ID: crashOrder, AmountCents: 6000, Simulate: "slow"})
	holder, m := exampletest.WaitForAny(t, copies, regexp.MustCompile(`msg=charging order=`+crashOrder+` .*fencing_token=(\d+)`), time.Minute)
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
	if len(survivor.Lines(deferred)) < 1 {
		t.Error("the survivor deferred no copy of the crash order while the dead copy's lease ran out, or while it charged it")
	}

	want := []string{crashOrder}
	for i := range 10 {
		o := order{ID: fmt.Sprintf("order-%03d", i+1), AmountCents: 100}
		send(o)
		send(o)
		want = append(want, o.ID)
	}
	deadline := time.Now().Add(time.Minute)
	for len(ledgerEntries(t, prefix)) < len(want) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	ledger := ledgerEntries(t, prefix)
	for _, id := range want {
		if ledger[id].Charges != 1 {
			t.Errorf("order %s charged %d times", id, ledger[id].Charges)
		}
	}
	if ledger[crashOrder].Token != takeoverToken {
		t.Errorf("the ledger kept token %d for the crash order, the takeover's was %d", ledger[crashOrder].Token, takeoverToken)
	}

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
}
