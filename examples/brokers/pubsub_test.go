package brokers_test

import (
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-googlecloud/v2/pkg/googlecloud"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/examples/internal/story"
)

// Google Pub/Sub (the Go client's in-process pstest server) under
// watermill-googlecloud, one subscription shared by both consumers. A nack
// redelivers at once (pstest), and a message held past its ack deadline is
// delivered again, to either consumer.
func TestGooglePubSub(t *testing.T) {
	story.Tell(t, func(t *testing.T) story.Broker {
		srv := pstest.NewServer()
		t.Cleanup(func() { _ = srv.Close() })
		t.Setenv("PUBSUB_EMULATOR_HOST", srv.Addr)
		logger := watermill.NopLogger{}
		const project = "story"
		pub, err := googlecloud.NewPublisher(googlecloud.PublisherConfig{ProjectID: project}, logger)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		return story.Broker{
			Name:      "Google Pub/Sub",
			Publisher: pub,
			Topic:     "orders",
			Subscriber: func(string) (message.Subscriber, error) {
				sub, err := googlecloud.NewSubscriber(googlecloud.SubscriberConfig{
					ProjectID:                project,
					GenerateSubscriptionName: googlecloud.TopicSubscriptionNameWithSuffix("-billing"),
					InitializeTimeout:        10 * time.Second,
				}, logger)
				if err == nil {
					t.Cleanup(func() { _ = sub.Close() })
				}
				return sub, err
			},
		}
	})
}
