package brokers_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// NATS JetStream with one durable queue consumer shared by both consumers,
// two subscriptions each. The server's AckWait (1s) is shorter than the
// slow order, so JetStream delivers it again, to a random member, while it
// runs: those copies wait in the middleware. watermill-nats cancels a
// message's context when its own AckWaitTimeout passes without an ack,
// so that one must outlast the slowest handler.
func TestNATSJetStream(t *testing.T) {
	const (
		serverAckWait = time.Second
		handlerLimit  = 30 * time.Second // watermill-nats' AckWaitTimeout
	)
	story.Tell(t, func(t *testing.T) story.Broker {
		url := testserver.Env("NATS_URL", "nats://127.0.0.1:4222")
		name := strings.ReplaceAll(strings.TrimSuffix(testserver.Unique("orders-"), ":"), ":", "-")
		js := wmnats.JetStreamConfig{
			AutoProvision:    true,
			DurablePrefix:    name,
			SubscribeOptions: []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit(), nats.AckWait(serverAckWait)},
		}
		logger := watermill.NopLogger{}
		pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{URL: url, JetStream: js}, logger)
		if err != nil {
			t.Fatalf("NATS (NATS_URL): %v", err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		t.Cleanup(func() { deleteStream(t, url, name) })
		return story.Broker{
			Name:      "NATS JetStream",
			Publisher: pub,
			Topic:     name,
			Subscriber: func(string) (message.Subscriber, error) {
				sub, err := wmnats.NewSubscriber(wmnats.SubscriberConfig{
					URL:              url,
					QueueGroupPrefix: name,
					SubscribersCount: 2,
					AckWaitTimeout:   handlerLimit,
					CloseTimeout:     5 * time.Second,
					JetStream:        js,
				}, logger)
				if err == nil {
					t.Cleanup(func() { _ = sub.Close() })
				}
				return sub, err
			},
			Configure:              func(c *idempotency.Config) { c.LeaseTTL = 10 * time.Second },
			SlowFor:                3 * time.Second,
			RedeliversWhileRunning: true,
		}
	})
}

// deleteStream removes the stream a test provisioned: the server keeps
// streams on disk.
func deleteStream(t *testing.T, url, name string) {
	nc, err := nats.Connect(url)
	if err != nil {
		t.Errorf("deleting stream %s: %v", name, err)
		return
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err == nil {
		err = js.DeleteStream(name)
	}
	if err != nil {
		t.Errorf("deleting stream %s: %v", name, err)
	}
}
