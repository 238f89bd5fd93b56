package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	examplemetrics "github.com/watermill-idempotency/idempotency/examples/internal/metrics"
	"github.com/watermill-idempotency/idempotency/examples/internal/output"
	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

// The example end to end against the real Redis ($REDIS_ADDR): Redis Streams for the messages, Redis for the leases,
// and a scrape of its /metrics.
func TestRedisStreamsExample(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := Run(ctx, Config{RedisAddr: testenv.Service(t, "REDIS_ADDR"), Orders: 50, Prefix: testenv.Unique("example-redis-")}, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := output.EndsWithVerdict(out.String(), "Check: 54 orders charged once each"); err != nil {
		t.Fatal(err)
	}
	for order, n := range rep.Applied {
		if n != 1 {
			t.Errorf("order %s charged %d times", order, n)
		}
	}
	if rep.SlowRedelivered < 1 || rep.SlowInFlight < 1 {
		t.Errorf("the slow order was not claimed while it ran, or its copies not caught: %+v", rep.Report)
	}
	// The /metrics scrape: the middleware's metric by outcome, and
	// Watermill's router metric next to it.
	got := rep.Scraped.Deliveries
	if got["processed"] != 54 || got["handler_failed"] < 1 || got["store_error"] != 2 || got["duplicate"] < 50 {
		t.Errorf("scraped watermill_idempotency_deliveries_total %v: want 54 processed, 1 or more handler_failed, 2 store_error, 50 or more duplicate", got)
	}
	if rep.Scraped.HandlerExecutions < float64(rep.Published) {
		t.Errorf("scraped %v handler executions for %d messages", rep.Scraped.HandlerExecutions, rep.Published)
	}
}

// The story on Redis Streams with the leases in Redis and in Postgres.
func TestRedisStreams(t *testing.T) {
	story.Tell(t, func(t *testing.T) story.Broker {
		client := testenv.RedisClient(t) // its subscribers close it
		prefix := testenv.Unique("redis-story-")
		t.Cleanup(func() { client.Del(context.Background(), prefix+"orders") })
		b, err := newBroker(client, prefix)
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// The check behind the printed verdict also fails when /metrics disagrees.
func TestReportCheckCatchesMetricsDisagreement(t *testing.T) {
	r := Report{Report: story.Report{Published: 3, Outcomes: map[string]int64{"processed": 2}},
		Scraped: examplemetrics.Scraped{Deliveries: map[string]float64{"processed": 1}, HandlerExecutions: 3}}
	if r.Scraped.Check(map[string]int64{"processed": 2}, 3) == nil || r.Check() == nil {
		t.Error("a disagreeing scrape passed")
	}
}
