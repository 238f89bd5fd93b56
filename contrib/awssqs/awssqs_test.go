package awssqs_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/contrib/awssqs"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

type delivery struct {
	at       time.Time
	metadata message.Metadata
	err      error
}

// run delivers one message whose key another worker holds for holdFor,
// through a real watermill-aws subscriber on goaws, and returns the
// deliveries seen until the handler has run. The queue's visibility
// timeout is 1s; with Defer, the in-flight message should instead come
// back when the holder's lease runs out.
func run(t *testing.T, endpoint string, withDefer bool, holdFor time.Duration) []delivery {
	ctx := context.Background()
	awsCfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("x", "x", "")}
	optFns := []func(*sqs.Options){func(o *sqs.Options) { o.BaseEndpoint = aws.String(endpoint) }}
	client := sqs.NewFromConfig(awsCfg, optFns...)
	queue := fmt.Sprintf("defer-%s-%d", os.Getenv("IDEM_TEST_RUN"), time.Now().UnixNano())
	created, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(queue), Attributes: map[string]string{"VisibilityTimeout": "1"}})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: created.QueueUrl})
	})

	store := newMemstore()
	holder, err := store.Acquire(ctx, backends.AcquireRequest{Key: "charge:order-1", Owner: "other-worker", LeaseTTL: holdFor, Retention: time.Hour})
	require.NoError(t, err)
	idem, err := idempotency.New(idempotency.Config{
		Store: store, Namespace: "charge", Key: keyfunc.JSONField("order_id"),
		Timing: idempotency.Timing{InProgressWait: -1}, // nack at once, to see when SQS brings it back
	})
	require.NoError(t, err)

	var mu sync.Mutex
	var seen []delivery
	ran := make(chan struct{})
	record := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			mu.Lock()
			seen = append(seen, delivery{at: time.Now(), metadata: maps.Clone(msg.Metadata), err: err})
			mu.Unlock()
			return out, err
		}
	}
	logger := watermill.NopLogger{}
	sub, err := wsqs.NewSubscriber(wsqs.SubscriberConfig{
		AWSConfig: awsCfg, OptFns: optFns, DoNotCreateQueueIfNotExists: true,
		Unmarshaler: awssqs.Unmarshaler{},
		GenerateReceiveMessageInput: func(ctx context.Context, url wsqs.QueueURL) (*sqs.ReceiveMessageInput, error) {
			in, err := wsqs.GenerateReceiveMessageInputDefault(ctx, url)
			in.WaitTimeSeconds = 1
			return in, err
		},
	}, logger)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	require.NoError(t, err)
	chain := []message.HandlerMiddleware{record}
	if withDefer {
		deferrer, err := awssqs.NewDefer(awssqs.DeferConfig{Client: client})
		require.NoError(t, err)
		chain = append(chain, deferrer.Middleware)
	}
	chain = append(chain, idem.Middleware)
	router.AddConsumerHandler("charge", queue, sub, func(msg *message.Message) error {
		if _, leaked := msg.Metadata[awssqs.ReceiptHandleKey]; leaked && withDefer {
			return errors.New("the receipt handle reached the handler")
		}
		close(ran)
		return nil
	}).AddMiddleware(chain...)
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	defer router.Close()

	pub, err := wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: awsCfg, OptFns: optFns, DoNotCreateQueueIfNotExists: true}, logger)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(queue, message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"order-1"}`))))

	// The holder gives the key up soon after the first delivery was nacked.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) > 0 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, store.Release(ctx, holder.Lease))
	select {
	case <-ran:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never ran")
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return seen[len(seen)-1].err == nil }, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	return append([]delivery(nil), seen...)
}

// With Defer, an in-flight duplicate comes back when the holder's lease runs
// out (6s), not after the queue's 1s visibility timeout; without it, it
// comes back after about 1s and is nacked again while the holder still holds.
func TestDeferDelaysAnInFlightDuplicate(t *testing.T) {
	// $SQS_ENDPOINT: `make test` starts a private goaws and sets it.
	endpoint := os.Getenv("SQS_ENDPOINT")
	if endpoint == "" {
		t.Fatal("SQS_ENDPOINT is not set. Run the tests with `make test`, which starts a private goaws and sets it, " +
			"or set it to an SQS endpoint the tests may create queues on")
	}
	const holdFor = 6 * time.Second

	t.Run("with Defer", func(t *testing.T) {
		seen := run(t, endpoint, true, holdFor)
		require.Len(t, seen, 2, "one nack, then the run")
		require.ErrorIs(t, seen[0].err, idempotency.ErrInProgress)
		gap := seen[1].at.Sub(seen[0].at)
		require.Greater(t, gap, 4*time.Second, "the redelivery waited for the holder's lease, not the 1s visibility timeout")
		for _, d := range seen {
			require.NotContains(t, d.metadata, awssqs.ReceiptHandleKey, "the receipt handle is taken out before anyone sees it")
		}
	})
	t.Run("without Defer", func(t *testing.T) {
		seen := run(t, endpoint, false, holdFor)
		require.ErrorIs(t, seen[0].err, idempotency.ErrInProgress)
		require.Less(t, seen[1].at.Sub(seen[0].at), 3*time.Second, "the queue's 1s visibility timeout brings it back early")
	})
}

func TestUnmarshalerRecordsReceiptHandle(t *testing.T) {
	m, err := awssqs.Unmarshaler{}.Unmarshal(&types.Message{MessageId: aws.String("id"), ReceiptHandle: aws.String("rh-1"), Body: aws.String("body")})
	require.NoError(t, err)
	require.Equal(t, "rh-1", m.Metadata.Get(awssqs.ReceiptHandleKey))
	require.Equal(t, "body", string(m.Payload))
}

func TestNewDeferValidates(t *testing.T) {
	_, err := awssqs.NewDefer(awssqs.DeferConfig{})
	require.ErrorIs(t, err, awssqs.ErrInvalidConfig)
	_, err = awssqs.NewDefer(awssqs.DeferConfig{Client: (*sqs.Client)(nil)})
	require.ErrorIs(t, err, awssqs.ErrInvalidConfig, "a typed nil client")
	client := sqs.NewFromConfig(aws.Config{Region: "us-east-1"})
	_, err = awssqs.NewDefer(awssqs.DeferConfig{Client: client, MaxDelay: 13 * time.Hour})
	require.ErrorIs(t, err, awssqs.ErrInvalidConfig)
	_, err = awssqs.NewDefer(awssqs.DeferConfig{Client: client})
	require.NoError(t, err)
}

// newMemstore is memstore.New with the zero options, which it never
// refuses.
func newMemstore() *memstore.Store {
	s, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	return s
}
