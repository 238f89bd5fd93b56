package main

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"
)

// The example end to end against the real Redis ($REDIS_ADDR, default
// 127.0.0.1:6379): Redis Streams for the messages, Redis for the leases.
func TestRedisStreamsExample(t *testing.T) {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := Run(ctx, Config{RedisAddr: addr, Orders: 50}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	for order, n := range rep.ChargesPerOrder {
		if n != 1 {
			t.Errorf("order %s charged %d times", order, n)
		}
	}
	if len(rep.ChargesPerOrder) != 52 || rep.Processed != 52 {
		t.Errorf("%d orders charged, %d processed; want 52: nothing lost", len(rep.ChargesPerOrder), rep.Processed)
	}
	if rep.Duplicates < 50 {
		t.Errorf("%d duplicates dropped; the producer sent 50 retries", rep.Duplicates)
	}
	if rep.FailedAttempts != 1 {
		t.Errorf("%d failed attempts; want the flaky order's one, retried", rep.FailedAttempts)
	}
	if rep.SlowOrderDeliveries < 2 || !rep.SlowOrderCaught || rep.DuplicatesAfterWait < 1 {
		t.Errorf("the claim of the slow order was not caught by the lease: %+v", rep)
	}
}
