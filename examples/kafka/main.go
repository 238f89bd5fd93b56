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
// While the slow order runs, the group scales out: a third member joins
// (its messages go to the other consumer's handler). The busy members,
// the slow order's holder and the consumer whose copy of it waits, cannot
// take part in the rebalance this starts, as Sarama rejoins only once
// their handlers have returned; after the rebalance timeout (1s
// here; Sarama's default is 60s) the coordinator evicts them and the
// newcomer reads their partitions from the last committed offsets: the
// slow order's message again, while its first delivery still runs. A
// handler that outlasts the rebalance timeout meets this at every deploy
// or scale-out. The middleware makes the redelivered copy wait for the
// holder and nacks it while the order is in progress; the holder keeps
// its lease and charges the order once. Its ack, from a member no longer
// in the group, commits no offset; a later delivery, acked as a duplicate
// once the order is charged, does.
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
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
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
	prefix := fmt.Sprintf("kafka-example-%d:", time.Now().UnixNano())
	if err := run(ctx, os.Getenv("KAFKA_BROKERS"), env("REDIS_ADDR", "127.0.0.1:6379"), prefix, os.Stdout); err != nil {
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

func run(ctx context.Context, kafkaBrokers, redisAddr, prefix string, w io.Writer) error {
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", redisAddr, err)
	}
	store, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
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
// Its Redeliver adds a member to the group under the consumer that does
// not hold the slow order. watermill-kafka waits for a handler's ack
// whatever the group does, so a member busy in a handler misses the
// rebalance and is evicted after rebalanceTimeout.
func newBroker(brokers []string, group string) (story.Broker, func(), error) {
	logger := watermill.NopLogger{}
	pubCfg := kafka.DefaultSaramaSyncPublisherConfig()
	pubCfg.Producer.Partitioner = sarama.NewManualPartitioner
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: attemptPartitioner{}, OverwriteSaramaConfig: pubCfg}, logger)
	if err != nil {
		return story.Broker{}, nil, err
	}
	newMember := func() (message.Subscriber, error) {
		cfg := kafka.DefaultSaramaSubscriberConfig()
		cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
		cfg.Consumer.Group.Rebalance.Timeout = rebalanceTimeout
		// An evicted member learns it at its next heartbeat, and stops
		// taking messages from the partitions it lost.
		cfg.Consumer.Group.Heartbeat.Interval = 200 * time.Millisecond
		return kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers:               brokers,
			ConsumerGroup:         group,
			Unmarshaler:           kafka.DefaultMarshaler{},
			OverwriteSaramaConfig: cfg,
			NackResendSleep:       100 * time.Millisecond,
		}, logger)
	}
	var (
		mu        sync.Mutex
		consumers = map[string]*consumer{}
	)
	closeAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range consumers {
			_ = c.Close()
		}
		_ = pub.Close()
	}
	return story.Broker{
		Name:      "Kafka",
		Publisher: pub,
		Topic:     topic,
		SlowFor:   4 * time.Second,
		Subscriber: func(name string) (message.Subscriber, error) {
			c := &consumer{newMember: newMember, closing: make(chan struct{})}
			mu.Lock()
			defer mu.Unlock()
			consumers[name] = c
			return c, nil
		},
		Redeliver: func(holder string) {
			mu.Lock()
			var other *consumer
			for name, c := range consumers {
				if name != holder {
					other = c
				}
			}
			mu.Unlock()
			if other != nil {
				// An error leaves the group as it was: the check reports
				// that nothing was redelivered.
				_ = other.join()
			}
		},
	}, closeAll, nil
}

// rebalanceTimeout is how long the coordinator waits for the group's
// members to rejoin a rebalance before it evicts them: well within the
// slow order, so that it is redelivered while it runs.
const rebalanceTimeout = time.Second

// consumer is one consumer's subscriber: its member of the consumer group,
// and any member added to it later, all handing their messages to its one
// handler.
type consumer struct {
	newMember func() (message.Subscriber, error)

	mu      sync.Mutex
	members []message.Subscriber
	ctx     context.Context
	topic   string
	out     chan *message.Message
	// pending counts the members' channels still open, plus one while the
	// consumer is open, so that out is closed only once no member can be
	// added.
	pending   sync.WaitGroup
	closed    bool
	closing   chan struct{}
	closeOnce sync.Once
}

// Subscribe joins the group with the consumer's first member.
func (c *consumer) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	c.mu.Lock()
	if c.out != nil {
		c.mu.Unlock()
		return nil, errors.New("kafka example: a consumer subscribes once")
	}
	c.ctx, c.topic, c.out = ctx, topic, make(chan *message.Message)
	c.pending.Add(1)
	c.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-c.closing:
		}
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		c.pending.Done()
	}()
	go func() {
		c.pending.Wait()
		close(c.out)
	}()
	if err := c.join(); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c.out, nil
}

// join adds a member to the group, handing its messages to the consumer.
func (c *consumer) join() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.out == nil {
		return errors.New("kafka example: consumer not subscribed")
	}
	sub, err := c.newMember()
	if err != nil {
		return err
	}
	msgs, err := sub.Subscribe(c.ctx, c.topic)
	if err != nil {
		_ = sub.Close()
		return err
	}
	c.members = append(c.members, sub)
	c.pending.Add(1)
	go func() {
		defer c.pending.Done()
		for msg := range msgs {
			c.out <- msg
		}
	}()
	return nil
}

// Close closes every member: they leave the group.
func (c *consumer) Close() error {
	c.closeOnce.Do(func() { close(c.closing) })
	c.mu.Lock()
	c.closed = true
	members := c.members
	c.members = nil
	c.mu.Unlock()
	var errs []error
	for _, m := range members {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
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
