package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/watermill-idempotency/idempotency/contrib/awssqs"
	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// sqsClient is a client of the SQS at $SQS_ENDPOINT (goaws under
// `make test`), and its options for watermill-aws.
func sqsClient(t *testing.T) (aws.Config, []func(*sqs.Options), *sqs.Client) {
	awsCfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")}
	endpoint := []func(*sqs.Options){func(o *sqs.Options) { o.BaseEndpoint = aws.String(testenv.Service(t, "SQS_ENDPOINT")) }}
	return awsCfg, endpoint, sqs.NewFromConfig(awsCfg, endpoint...)
}

// deleteQueues deletes the named queues when the test ends.
func deleteQueues(t *testing.T, client *sqs.Client, names ...string) {
	t.Cleanup(func() {
		ctx := context.Background()
		for _, name := range names {
			url, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
			if err == nil {
				_, err = client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: url.QueueUrl})
			}
			if err != nil && !strings.Contains(err.Error(), "NonExistentQueue") {
				t.Errorf("deleting queue %s: %v", name, err)
			}
		}
	})
}

// The story on SQS, with the leases in Redis and in Postgres: one queue
// read by both consumers, Defer in front of the middleware, the example's
// visibility timeout (2s) and LeaseTTL (the same).
func TestSQS(t *testing.T) {
	story.Tell(t, func(t *testing.T) story.Broker {
		awsCfg, endpoint, client := sqsClient(t)
		queue := strings.ReplaceAll(testenv.Unique("story-sqs-"), ":", "") + "orders"
		ctx := context.Background()
		if _, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{
			QueueName:  aws.String(queue),
			Attributes: map[string]string{"VisibilityTimeout": strconv.Itoa(int(visibilityTimeout.Seconds()))},
		}); err != nil {
			t.Fatal(err)
		}
		deleteQueues(t, client, queue)
		deferrer, err := awssqs.NewDefer(awssqs.DeferConfig{Client: client})
		if err != nil {
			t.Fatal(err)
		}
		logger := watermill.NopLogger{}
		pub, err := wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: awsCfg, OptFns: endpoint, DoNotCreateQueueIfNotExists: true}, logger)
		if err != nil {
			t.Fatal(err)
		}
		return story.Broker{
			Name:      "SQS",
			Publisher: pub,
			Topic:     queue,
			Subscriber: func(string) (message.Subscriber, error) {
				return wsqs.NewSubscriber(wsqs.SubscriberConfig{
					AWSConfig:                   awsCfg,
					OptFns:                      endpoint,
					DoNotCreateQueueIfNotExists: true,
					ConsumeWorkers:              2,
					Unmarshaler:                 awssqs.Unmarshaler{},
					GenerateReceiveMessageInput: func(ctx context.Context, url wsqs.QueueURL) (*sqs.ReceiveMessageInput, error) {
						in, err := wsqs.GenerateReceiveMessageInputDefault(ctx, url)
						if err == nil {
							in.WaitTimeSeconds = 1
						}
						return in, err
					},
				}, logger)
			},
			Middleware: []message.HandlerMiddleware{deferrer.Middleware},
			Configure: func(c *idempotency.Config) {
				c.LeaseTTL = visibilityTimeout
				c.Timing.InProgressWait = 200 * time.Millisecond
			},
			// Over twice the visibility timeout: SQS shows the slow order's
			// message again one visibility timeout after it was received,
			// and a consumer must then receive it (a long poll) while the
			// order still runs.
			SlowFor:                9 * visibilityTimeout / 4,
			RedeliversWhileRunning: true,
		}
	})
}
