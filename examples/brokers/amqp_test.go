package brokers_test

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

// RabbitMQ with a durable work queue shared by both consumers. A nack
// requeues the message at once; an in-flight duplicate waits in the
// middleware instead of spinning. While the slow order runs, its
// consumer's connection is cut under it: RabbitMQ requeues the message
// the consumer held unacked and hands it to the other consumer, while
// the handler goes on (watermill-amqp keeps waiting for its ack, then
// reconnects).
func TestAMQP(t *testing.T) {
	story.Tell(t, func(t *testing.T) story.Broker {
		cfg := amqp.NewDurableQueueConfig(testenv.Service(t, "AMQP_URL"))
		logger := watermill.NopLogger{}
		pub, err := amqp.NewPublisher(cfg, logger)
		if err != nil {
			t.Fatalf("RabbitMQ (AMQP_URL): %v", err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		topic := testenv.Unique("orders-")
		t.Cleanup(func() { deleteQueue(t, cfg.Connection.AmqpURI, topic) })
		var conns cutter
		return story.Broker{
			Name:      "AMQP",
			Publisher: pub,
			Topic:     topic,
			Redeliver: conns.cut,
			Subscriber: func(consumer string) (message.Subscriber, error) {
				cfg := cfg
				// With watermill-amqp's default prefetch of 1, the message
				// RabbitMQ requeues when the holder's connection is cut
				// queues behind the other copy of its order, which the
				// waiting consumer keeps nacking and RabbitMQ puts back
				// ahead of it (a requeued message keeps its place): it
				// comes back only once the holder is done. With room to
				// prefetch it arrives while the holder still runs.
				cfg.Consume.Qos.PrefetchCount = 10
				cfg.Connection.AmqpConfig = &amqp091.Config{
					Heartbeat: 10 * time.Second,
					Locale:    "en_US",
					Dial:      conns.dialer(consumer),
				}
				sub, err := amqp.NewSubscriber(cfg, logger)
				if err == nil {
					t.Cleanup(func() { _ = sub.Close() })
				}
				return sub, err
			},
		}
	})
}

// deleteQueue removes the durable queue a test declared.
func deleteQueue(t *testing.T, uri, queue string) {
	conn, err := amqp091.Dial(uri)
	if err != nil {
		t.Errorf("deleting queue %s: %v", queue, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDelete(queue, false, false, false)
	}
	if err != nil {
		t.Errorf("deleting queue %s: %v", queue, err)
	}
}

// cutter keeps each consumer's connections to the broker, to cut them
// as a network failure would.
type cutter struct {
	mu    sync.Mutex
	conns map[string][]net.Conn
}

// dialer dials for consumer and keeps the connection.
func (c *cutter) dialer(consumer string) func(network, addr string) (net.Conn, error) {
	return func(network, addr string) (net.Conn, error) {
		conn, err := net.DialTimeout(network, addr, 10*time.Second)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.conns == nil {
			c.conns = map[string][]net.Conn{}
		}
		c.conns[consumer] = append(c.conns[consumer], conn)
		return conn, nil
	}
}

// cut closes consumer's connections.
func (c *cutter) cut(consumer string) {
	c.mu.Lock()
	conns := c.conns[consumer]
	delete(c.conns, consumer)
	c.mu.Unlock()
	for _, conn := range conns {
		_ = conn.Close()
	}
}
