package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/watermill-idempotency/idempotency/examples/internal/output"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

// The example end to end on the goaws SQS emulator, with the leases in
// the real Redis and, in a second run, the real Postgres.
func TestSQSExample(t *testing.T) {
	endpoint := testserver.StartGoaws(t)
	for _, store := range []string{"redis", "postgres"} {
		t.Run(store, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out bytes.Buffer
			rep, err := Run(ctx, Config{
				Endpoint:    endpoint,
				Region:      "us-east-1",
				Store:       store,
				RedisAddr:   env("REDIS_ADDR", "127.0.0.1:6379"),
				DatabaseURL: env("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
				Orders:      20,
			}, &out)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			t.Log("\n" + out.String())
			if err := output.EndsWithVerdict(out.String(), "Check: 22 orders charged once each"); err != nil {
				t.Fatal(err)
			}
			for order, n := range rep.ChargesPerOrder {
				if n != 1 {
					t.Errorf("order %s charged %d times", order, n)
				}
			}
			if len(rep.ChargesPerOrder) != 22 || rep.Processed != 22 {
				t.Errorf("%d orders charged, %d processed; want 22: nothing lost", len(rep.ChargesPerOrder), rep.Processed)
			}
			if rep.Duplicates < 20 {
				t.Errorf("%d duplicates dropped; the producer sent 20 retries", rep.Duplicates)
			}
			if rep.FailedAttempts != 1 {
				t.Errorf("%d failed attempts; want the flaky order's one, retried after the visibility timeout", rep.FailedAttempts)
			}
			if rep.SlowOrderDeliveries < 2 || !rep.SlowOrderCaught || rep.Deferred < 1 {
				t.Errorf("the slow order's in-flight copies were not deferred and caught: %+v", rep)
			}
		})
	}
}

// The check behind the printed verdict fails on what it must catch.
func TestReportCheckCatchesFailures(t *testing.T) {
	good := func() Report {
		return Report{Orders: 2, ChargesPerOrder: map[string]int{"a": 1, "b": 1}, FailedAttempts: 1,
			SlowOrderDeliveries: 2, SlowOrderCaught: true, Deferred: 1}
	}
	if err := good().Check(); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]func(r *Report){
		"an order charged twice": func(r *Report) { r.ChargesPerOrder["a"] = 2 },
		"an order lost":          func(r *Report) { delete(r.ChargesPerOrder, "b") },
		"nothing deferred":       func(r *Report) { r.Deferred = 0 },
	} {
		r := good()
		bad(&r)
		if r.Check() == nil {
			t.Errorf("%s: the check passed", name)
		}
	}
}
