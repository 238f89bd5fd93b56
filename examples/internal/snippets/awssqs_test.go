// Package snippets holds the code of docs/ that needs the examples'
// dependencies (the AWS SDK, contrib/awssqs); internal/docs checks that the
// docs show it as it is here.
package snippets

import (
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	awssdk "github.com/aws/aws-sdk-go-v2/service/sqs"

	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// snippet:defer
import (
	"github.com/ThreeDotsLabs/watermill-aws/sqs"

	"github.com/watermill-idempotency/idempotency/contrib/awssqs"
)

// end snippet

var _ = deferSetup

func deferSetup(router *message.Router, cfg aws.Config, sqsClient *awssdk.Client, logger watermill.LoggerAdapter,
	idem *idempotency.Idempotency, poisonQueue, retry message.HandlerMiddleware) (message.Subscriber, error) {
	// snippet:defer
	sub, err := sqs.NewSubscriber(sqs.SubscriberConfig{
		AWSConfig:   cfg,
		Unmarshaler: awssqs.Unmarshaler{}, // keeps each message's receipt handle for Defer
	}, logger)
	if err != nil {
		return nil, err
	}
	deferrer, err := awssqs.NewDefer(awssqs.DeferConfig{Client: sqsClient}) // a *sqs.Client
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(poisonQueue, deferrer.Middleware, idem.Middleware, retry)
	// end snippet
	return sub, nil
}
