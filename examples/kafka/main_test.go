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

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/examples/internal/exampletest"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

// exampleEnv is the example's configuration for a test: the Kafka at
// brokers (none: in process), the test's Redis, a free port for /metrics,
// and names that hold the run's id.
func exampleEnv(t *testing.T, brokers, prefix string) []string {
	return []string{"KAFKA_BROKERS=" + brokers, "REDIS_ADDR=" + testenv.Service(t, "REDIS_ADDR"), "METRICS_ADDR=127.0.0.1:0", "PREFIX=" + prefix}
}

// deleteAll deletes, when the test ends, every key the example made in
// Redis: its leases and its ledger.
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

// ledgerEntries reads the ledger as Redis has it, apart from the example's
// own code: each order's charges and the fencing token of the last one.
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

var (
	consuming = regexp.MustCompile(`msg=consuming `)
	shutDown  = regexp.MustCompile(`msg="shut down: no handler running"`)
	charging  = func(order string) *regexp.Regexp {
		return regexp.MustCompile(`msg=charging order=` + order + ` .*fencing_token=(\d+)`)
	}
)

// The demo as a user runs it (`make example-kafka`): Kafka in process,
// the leases and the ledger in the test's Redis. The program exits 0 with
// its verdict last, both copies of the service it ran shut down
// gracefully, and Redis holds what it claims: every order charged once,
// its lease completed under the token the ledger kept.
func TestKafkaExample(t *testing.T) {
	bin := exampletest.Build(t, ".")
	client := testenv.RedisClient(t)
	prefix := testenv.Unique("example-kafka-")
	deleteAll(t, client, prefix)

	p := exampletest.Start(t, "the kafka example", bin, nil, exampleEnv(t, "", prefix)...)
	if code := p.Wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	summary, err := exampletest.ParseSummary(p.Output(), "Check: 22 orders charged exactly once each")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(p.Lines(exampletest.MetricsURL)); n != 2 {
		t.Errorf("%d /metrics URLs printed, want one for each copy of the service", n)
	}
	if n := len(p.Lines(shutDown)); n != 2 {
		t.Errorf("%d graceful shutdowns reported, want one for each copy of the service", n)
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

	// The summary's numbers are what the demo sent (the slow order and
	// every ordinary order twice, the flaky order and a message without
	// an order id once), what Redis holds, and what the program logged.
	orders, second := 2+demoOrders, 1+demoOrders
	messages := orders + second + 1
	charges, attempts := 0, len(p.Lines(regexp.MustCompile(`msg=charging `)))
	for _, e := range ledger {
		charges += int(e.Charges)
	}
	e := exampletest.Expect{Summary: summary}
	e.Total("messages on the orders topic", messages)
	e.Part("messages on the orders topic", "orders", len(ledger))
	e.Part("messages on the orders topic", "second copies", second)
	e.Part("messages on the orders topic", "without an order id", 1)
	e.Part("deliveries to the routers", "messages", messages)
	e.Part("the same deliveries by outcome", "processed", len(ledger))
	e.That(e.Value("the same deliveries by outcome", "key_error") >= 1, "no key_error delivery: the message without an order id's")
	e.That(e.Value("the same deliveries by outcome", "duplicate") >= second, "fewer duplicates than second copies")
	e.Total("charge attempts", attempts)
	e.Part("charge attempts", "charges in the ledger", charges)
	e.Part("charge attempts", "failed", attempts-charges)
	e.Total("charges in the ledger", charges)
	e.Part("charges in the ledger", "orders charged", orders)
	e.Part("charges in the ledger", "charges of an order charged before", 0)
	if err := e.Err(); err != nil {
		t.Error(err)
	}
}

// Two copies of the service share a Kafka (kfake, started by the test),
// the leases and the ledger, as two instances of a deployment would: one
// consumer group, a partition each. The slow order's two copies, one on
// each partition, are handled at once, and one waits for the other's
// holder. Then the copy charging another slow order is killed (SIGKILL):
// once its session has timed out, the group gives its partitions to the
// survivor, which reads the order again from the last committed offset,
// takes the dead copy's lease over once it has run out, and charges the
// order under a newer fencing token. Every order is charged once, nothing
// reaches the poison topic, and the survivor shuts down gracefully on
// SIGTERM.
func TestKafkaExampleCopies(t *testing.T) {
	bin := exampletest.Build(t, ".")
	client := testenv.RedisClient(t)
	prefix := testenv.Unique("example-kafka-copies-")
	deleteAll(t, client, prefix)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()

	copies := []*exampletest.Process{
		exampletest.Start(t, "copy a", bin, []string{"-serve"}, exampleEnv(t, strings.Join(brokers, ","), prefix)...),
		exampletest.Start(t, "copy b", bin, []string{"-serve"}, exampleEnv(t, strings.Join(brokers, ","), prefix)...),
	}
	for _, p := range copies {
		p.WaitFor(consuming, time.Minute)
	}
	pubCfg := kafka.DefaultSaramaSyncPublisherConfig()
	pubCfg.Producer.Partitioner = sarama.NewManualPartitioner
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: partitionMarshaler{}, OverwriteSaramaConfig: pubCfg}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	send := func(o order, partition int) {
		t.Helper()
		payload, _ := json.Marshal(o)
		msg := message.NewMessage(watermill.NewUUID(), payload)
		msg.Metadata.Set(partitionMetadata, strconv.Itoa(partition))
		if err := pub.Publish(prefix+"orders", msg); err != nil {
			t.Fatal(err)
		}
	}

	slow := order{ID: slowOrder, AmountCents: 5000, Simulate: "slow"}
	send(slow, 0)
	send(slow, 1)
	exampletest.WaitForAny(t, copies, regexp.MustCompile(`msg=delivery outcome=(?:duplicate|in_progress) key=charge-order:`+slowOrder+` .*waited=`), time.Minute)

	const crashOrder = "order-crash"
	send(order{ID: crashOrder, AmountCents: 6000, Simulate: "slow"}, 0)
	holder, m := exampletest.WaitForAny(t, copies, charging(crashOrder), time.Minute)
	deadToken, _ := strconv.ParseInt(m[1], 10, 64)
	holder.Kill()
	survivor := copies[0]
	if survivor == holder {
		survivor = copies[1]
	}
	m = survivor.WaitFor(regexp.MustCompile(`msg=delivery outcome=processed key=charge-order:`+crashOrder+` .*fencing_token=(\d+) takeover=true`), 2*time.Minute)
	takeoverToken, _ := strconv.ParseInt(m[1], 10, 64)
	if takeoverToken <= deadToken {
		t.Errorf("the survivor charged the crash order under token %d, the dead copy held %d", takeoverToken, deadToken)
	}

	want := []string{slowOrder, crashOrder}
	for i := range 10 {
		o := order{ID: fmt.Sprintf("order-%03d", i+1), AmountCents: 100}
		send(o, 0)
		send(o, 1)
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
	if survivor.Find(shutDown) == nil {
		t.Error("the survivor did not report its graceful shutdown")
	}
	if n := messagesOn(t, brokers, prefix+"orders-poison"); n != 0 {
		t.Errorf("%d messages reached the poison topic", n)
	}
}

// messagesOn is how many messages topic holds, as Kafka has it.
func messagesOn(t *testing.T, brokers []string, topic string) int64 {
	t.Helper()
	client, err := sarama.NewClient(brokers, sarama.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, p := range parts {
		oldest, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
		newest, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		n += newest - oldest
	}
	return n
}
