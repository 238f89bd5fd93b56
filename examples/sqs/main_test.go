package main

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	examplemetrics "github.com/watermill-idempotency/idempotency/examples/internal/metrics"
	"github.com/watermill-idempotency/idempotency/examples/internal/output"
	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

func config(t *testing.T, store string) Config {
	return Config{
		Endpoint:    testenv.Service(t, "SQS_ENDPOINT"),
		Region:      "us-east-1",
		Store:       store,
		RedisAddr:   testenv.Service(t, "REDIS_ADDR"),
		DatabaseURL: testenv.Service(t, "TEST_DATABASE_URL"),
		Orders:      20,
		Prefix:      strings.TrimSuffix(testenv.Unique("example-sqs-"), ":"),
	}
}

// The example end to end on SQS ($SQS_ENDPOINT: goaws under `make test`),
// with the leases in the real Redis, then in the real Postgres, then in
// DynamoDB ($DYNAMODB_ENDPOINT: dynalite).
func TestSQSExample(t *testing.T) {
	for _, store := range []string{"redis", "postgres", "dynamodb"} {
		t.Run(store, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out bytes.Buffer
			cfg := config(t, store)
			cfg.DynamoEndpoint, cfg.DynamoNoTTL = testenv.Service(t, "DYNAMODB_ENDPOINT"), true
			rep, err := Run(ctx, cfg, &out)
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if err := output.EndsWithVerdict(out.String(), "Check: 24 orders charged once each"); err != nil {
				t.Fatal(err)
			}
			for order, n := range rep.Applied {
				if n != 1 {
					t.Errorf("order %s charged %d times", order, n)
				}
			}
			if rep.SlowInFlight < 1 || rep.Deferred < 1 {
				t.Errorf("the slow order's in-flight copies were not deferred and caught: %+v", rep)
			}
			// The /metrics scrape: the middleware's metric by outcome.
			got := rep.Scraped.Deliveries
			if got["processed"] != 24 || got["handler_failed"] < 1 || got["in_progress"] < 1 {
				t.Errorf("scraped watermill_idempotency_deliveries_total %v: want 24 processed, 1 or more handler_failed, some in_progress", got)
			}
		})
	}
}

// The story on SQS with the leases in Redis and in Postgres (the store
// Tell gives, over the example's broker).
func TestSQS(t *testing.T) {
	story.Tell(t, func(t *testing.T) story.Broker {
		cfg := config(t, "redis")
		cfg.Prefix = strings.TrimSuffix(testenv.Unique("story-sqs-"), ":")
		var deferred atomic.Int64
		b, err := newBroker(context.Background(), cfg, &deferred)
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// The check behind the printed verdict also fails without a deferred copy
// or when /metrics disagrees.
func TestReportCheckCatchesFailures(t *testing.T) {
	good := Report{Report: story.Report{}, Deferred: 1, Scraped: examplemetrics.Scraped{Deliveries: map[string]float64{}}}
	noDefer, disagree := good, good
	noDefer.Deferred = 0
	disagree.Published = 1 // and no handler executions scraped
	for name, r := range map[string]Report{"nothing deferred": noDefer, "/metrics disagrees": disagree} {
		if r.Check() == nil {
			t.Errorf("%s: the check passed", name)
		}
	}
}
