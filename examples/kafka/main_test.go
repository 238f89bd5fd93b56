package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/examples/internal/exampletest"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

// The demo as a user runs it (`make example-kafka`): Kafka in process,
// the leases and the ledger in the test's Redis. The program exits 0 with
// its verdict last, and Redis holds what it claims: every order charged
// once, its lease completed under the token the ledger kept.
func TestKafkaExample(t *testing.T) {
	bin := exampletest.Build(t, ".")
	client := testenv.RedisClient(t)
	prefix := testenv.Unique("example-kafka-")
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

	p := exampletest.Start(t, "the kafka example", bin, nil,
		"KAFKA_BROKERS=", "REDIS_ADDR="+testenv.Service(t, "REDIS_ADDR"), "METRICS_ADDR=127.0.0.1:0", "PREFIX="+prefix)
	if code := p.Wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	if err := exampletest.EndsWithVerdict(p.Output(), "Check: 22 orders charged exactly once each"); err != nil {
		t.Fatal(err)
	}
	if p.Find(exampletest.MetricsURL) == nil {
		t.Error("the /metrics URL was not printed")
	}

	want := []string{slowOrder, flakyOrder}
	for i := range demoOrders {
		want = append(want, fmt.Sprintf("order-%03d", i+1))
	}
	ledger := ledgerEntries(t, client, prefix+"ledger:")
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
}

// ledgerEntries reads the ledger as Redis has it, apart from the example's
// own code: each order's charges and the fencing token of the last one.
func ledgerEntries(t *testing.T, client *redis.Client, prefix string) map[string]entry {
	t.Helper()
	ctx := context.Background()
	out := map[string]entry{}
	keys, err := client.Keys(ctx, prefix+"*").Result()
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
		out[key[len(prefix):]] = entry{Token: token, Charges: charges}
	}
	return out
}
