package brokers_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

// RabbitMQ with a durable work queue shared by both consumers. A nack
// requeues the message at once; an in-flight duplicate waits in the
// middleware instead of spinning.
func TestAMQP(t *testing.T) {
	story.Tell(t, func(t *testing.T) story.Broker {
		cfg := amqp.NewDurableQueueConfig(testserver.Env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
		logger := watermill.NopLogger{}
		pub, err := amqp.NewPublisher(cfg, logger)
		if err != nil {
			t.Fatalf("RabbitMQ (AMQP_URL): %v", err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		topic := testserver.Unique("orders-")
		t.Cleanup(func() { deleteQueue(t, cfg.Connection.AmqpURI, topic) })
		return story.Broker{
			Name:      "AMQP",
			Publisher: pub,
			Topic:     topic,
			Subscriber: func(string) (message.Subscriber, error) {
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
