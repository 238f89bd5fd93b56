package brokers_test

import (
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-googlecloud/v2/pkg/googlecloud"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/examples/internal/story"
)

// Google Pub/Sub (the Go client's in-process pstest server) under
// watermill-googlecloud, one subscription shared by both consumers. A nack
// redelivers at once (pstest), and a message held past its ack deadline is
// delivered again, to either consumer. The client extends the deadline of
// a message it holds for up to an hour by default; here it does not, so
// the slow order, held longer than the shortest deadline the client asks
// for (10s), is delivered again while it runs, as it would be on Google
// Cloud from a subscriber that stalled or whose extensions were lost.
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
			Name:                   "Google Pub/Sub",
			Publisher:              pub,
			Topic:                  "orders",
			SlowFor:                13 * time.Second,
			RedeliversWhileRunning: true,
			Subscriber: func(string) (message.Subscriber, error) {
				sub, err := googlecloud.NewSubscriber(googlecloud.SubscriberConfig{
					ProjectID:                project,
					GenerateSubscriptionName: googlecloud.TopicSubscriptionNameWithSuffix("-billing"),
					InitializeTimeout:        10 * time.Second,
					// No automatic extension of the ack deadline.
					ReceiveSettings: pubsub.ReceiveSettings{MaxExtension: -1},
				}, logger)
				if err == nil {
					t.Cleanup(func() { _ = sub.Close() })
				}
				return sub, err
			},
		}
	})
}
