package brokers_test

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
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
		url := testenv.Service(t, "NATS_URL")
		name := strings.ReplaceAll(strings.TrimSuffix(testenv.Unique("orders-"), ":"), ":", "-")
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
		provision(t, url, name, serverAckWait)
		dialers := map[string]*cuttingDialer{}
		return story.Broker{
			Name:      "NATS JetStream",
			Publisher: pub,
			Topic:     name,
			Subscriber: func(consumer string) (message.Subscriber, error) {
				d := &cuttingDialer{}
				dialers[consumer] = d
				sub, err := wmnats.NewSubscriber(wmnats.SubscriberConfig{
					URL:              url,
					NatsOptions:      []nats.Option{nats.SetCustomDialer(d), nats.NoReconnect()},
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
			// A crash cuts the consumer's connection: closing its
			// subscriber would drain it, and a drained member's unacked
			// message is not redelivered to the others (docs/brokers.md).
			Crash: func(consumer string) { dialers[consumer].cut() },
			Configure: func(c *idempotency.Config) {
				c.LeaseTTL = 10 * time.Second
				c.Timing.InProgressWait = serverAckWait * 3 / 4 // below AckWait (docs/brokers.md)
			},
			// Each AckWait redelivery of the slow order goes to a random
			// member of the four, so one in four lands behind the running
			// handler itself and waits there. Over 6 s, five redeliveries
			// all land there one time in a thousand; over 3 s, one in
			// sixteen, as measured on a loaded machine.
			SlowFor:                6 * time.Second,
			RedeliversWhileRunning: true,
		}
	})
}

// cuttingDialer dials as usual and can cut every connection it made.
type cuttingDialer struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (d *cuttingDialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.Dial(network, address)
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.mu.Unlock()
	}
	return c, err
}

func (d *cuttingDialer) cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		_ = c.Close()
	}
}

// provision creates the stream and the durable queue consumer that
// watermill-nats (stream, subject, durable and queue group all named
// name) subscribes to. Left to the library, the consumer would be created
// by the first subscription and deleted when that one's subscriber closes
// (nats.go deletes a consumer it created on Unsubscribe or Drain), taking
// the pending messages of every other member with it: a crashed or
// redeployed first consumer would stall the rest.
func provision(t *testing.T, url, name string, ackWait time.Duration) {
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("NATS (NATS_URL): %v", err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err == nil {
		_, err = js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{name}})
	}
	if err == nil {
		_, err = js.AddConsumer(name, &nats.ConsumerConfig{
			Durable:        name,
			DeliverSubject: nats.NewInbox(),
			DeliverGroup:   name,
			DeliverPolicy:  nats.DeliverAllPolicy,
			AckPolicy:      nats.AckExplicitPolicy,
			AckWait:        ackWait,
			FilterSubject:  name,
		})
	}
	if err != nil {
		t.Fatalf("provisioning stream and consumer %s: %v", name, err)
	}
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
