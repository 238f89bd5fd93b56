package main

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// The story on Redis Streams, with the leases in Redis and in Postgres:
// one stream, one consumer group, each consumer's subscriber with a Redis
// client of its own, as a process of its own would (closing a
// watermill-redisstream subscriber closes its client). The example's
// settings: MaxIdleTime 1s, LeaseTTL three times that.
func TestRedisStreams(t *testing.T) {
	const maxIdle = time.Second
	story.Tell(t, func(t *testing.T) story.Broker {
		client := testenv.RedisClient(t)
		prefix := testenv.Unique("redis-story-")
		t.Cleanup(func() { client.Del(context.Background(), prefix+"orders") })
		logger := watermill.NopLogger{}
		pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, logger)
		if err != nil {
			t.Fatal(err)
		}
		group := prefix + "billing"
		return story.Broker{
			Name:      "Redis Streams",
			Publisher: pub,
			Topic:     prefix + "orders",
			Subscriber: func(consumer string) (message.Subscriber, error) {
				return redisstream.NewSubscriber(redisstream.SubscriberConfig{
					Client:          redis.NewClient(client.Options()),
					Consumer:        consumer,
					ConsumerGroup:   group,
					OldestId:        "0",
					MaxIdleTime:     maxIdle,
					ClaimInterval:   100 * time.Millisecond,
					NackResendSleep: 100 * time.Millisecond,
					BlockTime:       100 * time.Millisecond,
				}, logger)
			},
			Configure: func(c *idempotency.Config) { c.LeaseTTL = 3 * maxIdle },
			// A consumer reads what it claims on the channel it reads the
			// stream on, one entry at a time: one busy nacking a copy of the
			// slow order, as it would with a second copy from the producer,
			// handles the entry it claimed only once that copy is acked,
			// after the order ran. One copy leaves the other consumer free to
			// claim the holder's entry, idle past MaxIdleTime, while it still
			// runs.
			SlowCopies:             1,
			SlowFor:                4 * time.Second,
			RedeliversWhileRunning: true,
		}
	})
}
