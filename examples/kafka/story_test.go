package main

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

// The story on Kafka (kfake in process, two partitions, one consumer
// group), with the leases in Redis and in Postgres. While the slow order
// runs, the group scales out: a member joins under the consumer that does
// not hold the order, the busy members miss the rebalance and are
// evicted, and the newcomer reads the slow order's message again from the
// last committed offset while its first delivery still runs.
func TestKafka(t *testing.T) {
	const storyTopic = "orders"
	story.Tell(t, func(t *testing.T) story.Broker {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, storyTopic))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cluster.Close)
		b, closeFn, err := newStoryBroker(cluster.ListenAddrs(), storyTopic, testenv.Unique("billing-"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeFn)
		return b
	})
}

// newStoryBroker is Kafka as the story uses it: a publisher that puts each of
// the producer's copies on its own partition, and consumers in one group.
// Its Redeliver adds a member to the group under the consumer that does
// not hold the slow order. watermill-kafka waits for a handler's ack
// whatever the group does, so a member busy in a handler misses the
// rebalance and is evicted after rebalanceTimeout.
func newStoryBroker(brokers []string, topic, group string) (story.Broker, func(), error) {
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
