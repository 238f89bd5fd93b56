package main

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/watermill-idempotency/idempotency/examples/internal/output"
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
	if err := output.EndsWithVerdict(out.String(), "Check: 52 orders charged once each"); err != nil {
		t.Fatal(err)
	}
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

// The check behind the printed verdict fails on what it must catch.
func TestReportCheckCatchesFailures(t *testing.T) {
	good := func() Report {
		return Report{Orders: 2, ChargesPerOrder: map[string]int64{"a": 1, "b": 1}, Processed: 2, FailedAttempts: 1,
			SlowOrderDeliveries: 2, SlowOrderCaught: true}
	}
	if err := good().Check(); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]func(r *Report){
		"an order charged twice":        func(r *Report) { r.ChargesPerOrder["a"] = 2 },
		"an order lost":                 func(r *Report) { delete(r.ChargesPerOrder, "b"); r.Processed = 1 },
		"the slow order's claim missed": func(r *Report) { r.SlowOrderCaught = false },
	} {
		r := good()
		bad(&r)
		if r.Check() == nil {
			t.Errorf("%s: the check passed", name)
		}
	}
}
