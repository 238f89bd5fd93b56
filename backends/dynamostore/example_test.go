package dynamostore_test

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
)

// snippet:setup
import (
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// end snippet

// A router's idempotency on DynamoDB, its table created at start-up.
func ExampleNew() {
	ctx := context.Background()
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		panic(err)
	}
	var cfg aws.Config // from config.LoadDefaultConfig(ctx), as for every AWS client
	if err := setup(ctx, cfg, router); err != nil {
		panic(err)
	}
}

func setup(ctx context.Context, cfg aws.Config, router *message.Router) error {
	// snippet:setup
	// cfg is the aws.Config of config.LoadDefaultConfig(ctx).
	store, err := dynamostore.New(dynamodb.NewFromConfig(cfg), dynamostore.Options{
		Table:     "billing_idempotency",
		ClockSkew: time.Second, // the most two consumers' clocks may differ
	})
	if err != nil {
		return err
	}
	// Or create the table with CloudFormation or Terraform (docs/dynamodb.md).
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Key: keyfunc.JSONField("order_id")})
	if err != nil {
		return err
	}
	router.AddMiddleware(idem.Middleware)
	// end snippet
	return nil
}
