// Command kafka is the order-processing story on Kafka (watermill-kafka)
// with the idempotency middleware and its leases in Redis.
//
// Two consumers in one consumer group read a topic of two partitions. The
// producer sends every order twice (the same order_id under new message
// UUIDs), each copy to its own partition, so that copies are handled at
// once by different partition consumers; one order fails once; the lease
// store refuses one order's first acquisitions; one order is slow while its
// copy arrives. Every charge goes to a sink that refuses stale fencing
// tokens. At the end the run checks that every order was charged exactly
// once and exits non-zero if not.
//
// Kafka has no per-message nack: watermill-kafka retries a nacked message
// in place, and its partition waits meanwhile. A duplicate waiting in the
// middleware for the consumer that holds its key holds its partition too,
// for up to InProgressWait: size it to what a partition can afford.
//
// Configuration (environment): KAFKA_BROKERS (comma-separated; default: an
// in-process Kafka, franz-go's kfake, so that no server is needed),
// REDIS_ADDR (default 127.0.0.1:6379).
//
//	go run ./kafka
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/examples/internal/story"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, os.Getenv("KAFKA_BROKERS"), env("REDIS_ADDR", "127.0.0.1:6379"), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kafka example:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, kafkaBrokers, redisAddr string, w io.Writer) error {
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", redisAddr, err)
	}
	store, err := redisstore.New(client, redisstore.Options{Prefix: fmt.Sprintf("kafka-example-%d:", time.Now().UnixNano())})
	if err != nil {
		return err
	}
	defer store.Close()
	brokers := strings.Split(kafkaBrokers, ",")
	if kafkaBrokers == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
		if err != nil {
			return err
		}
		defer cluster.Close()
		brokers = cluster.ListenAddrs()
		fmt.Fprintf(w, "Kafka: in process (kfake) at %s\n", strings.Join(brokers, ","))
	}
	return tell(ctx, brokers, store, 20, w)
}

const (
	topic      = "orders"
	partitions = 2
)

// tell runs the story on Kafka at brokers, and prints its verdict last.
func tell(ctx context.Context, brokers []string, store backends.Store, orders int, w io.Writer) error {
	b, closeFn, err := newBroker(brokers, fmt.Sprintf("billing-%d", time.Now().UnixNano()))
	if err != nil {
		return err
	}
	defer closeFn()
	rep, err := story.Run(ctx, b, store, orders, w)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "Summary: "+rep.String())
	if err := rep.Check(); err != nil {
		fmt.Fprintf(w, "Check FAILED: %v\n", err)
		return err
	}
	fmt.Fprintf(w, "Check: %d orders charged once each through the fenced sink, no in-flight copy acked, the crashed consumer's order taken over, nothing poisoned.\n", len(rep.Applied))
	return nil
}

// newBroker is Kafka as the story uses it: a publisher that puts each of
// the producer's copies on its own partition, and consumers in one group.
func newBroker(brokers []string, group string) (story.Broker, func(), error) {
	logger := watermill.NopLogger{}
	pubCfg := kafka.DefaultSaramaSyncPublisherConfig()
	pubCfg.Producer.Partitioner = sarama.NewManualPartitioner
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: attemptPartitioner{}, OverwriteSaramaConfig: pubCfg}, logger)
	if err != nil {
		return story.Broker{}, nil, err
	}
	var subs []message.Subscriber
	closeAll := func() {
		for _, s := range subs {
			_ = s.Close()
		}
		_ = pub.Close()
	}
	return story.Broker{
		Name:      "Kafka",
		Publisher: pub,
		Topic:     topic,
		Subscriber: func(string) (message.Subscriber, error) {
			cfg := kafka.DefaultSaramaSubscriberConfig()
			cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
			sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
				Brokers:               brokers,
				ConsumerGroup:         group,
				Unmarshaler:           kafka.DefaultMarshaler{},
				OverwriteSaramaConfig: cfg,
				NackResendSleep:       100 * time.Millisecond,
			}, logger)
			if err == nil {
				subs = append(subs, sub)
			}
			return sub, err
		},
	}, closeAll, nil
}

// attemptPartitioner puts each of the producer's copies of an order on its
// own partition, so that the copies are handled at once: a Kafka consumer
// handles one message per partition at a time.
type attemptPartitioner struct{ kafka.DefaultMarshaler }

func (m attemptPartitioner) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	km, err := m.DefaultMarshaler.Marshal(topic, msg)
	if err != nil {
		return nil, err
	}
	attempt, _ := strconv.Atoi(msg.Metadata.Get(story.AttemptMetadata))
	km.Partition = int32(attempt % partitions)
	return km, nil
}
