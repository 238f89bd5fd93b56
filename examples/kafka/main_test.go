package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-idempotency/idempotency/examples/internal/output"
	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

// The example as a user runs it: in-process Kafka, leases in the real Redis.
func TestKafkaExample(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, "", testenv.Service(t, "REDIS_ADDR"), testenv.Unique("kafka-example-"), &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := output.EndsWithVerdict(out.String(), "Check: 24 orders charged once each"); err != nil {
		t.Fatal(err)
	}
}

// The story on Kafka (kfake in process, two partitions, one consumer
// group), with the leases in Redis and in Postgres.
func TestKafka(t *testing.T) {
	story.Tell(t, func(t *testing.T) story.Broker {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cluster.Close)
		b, closeFn, err := newBroker(cluster.ListenAddrs(), testenv.Unique("billing-"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeFn)
		return b
	})
}
