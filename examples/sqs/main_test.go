package main

import (
	"bytes"
	"context"
	"testing"
	"time"

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
			if rep.SlowOrderDeliveries < 2 || !rep.SlowOrderCaught {
				t.Errorf("the visibility-timeout redelivery of the slow order was not caught: %+v", rep)
			}
		})
	}
}
