package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Migrate creates the store's table if it does not exist, with on-demand
// capacity, waits until it is active, and, unless Options.TTL is
// TTLUntouched, turns on Time to Live on its ttl attribute
// (docs/dynamodb.md has the same schema for CloudFormation and
// Terraform). It is idempotent and safe to call from several instances at
// once. Correctness never depends on TTL, which deletes expired items
// lazily: it only reclaims space.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := s.api.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            s.table,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(attrID), AttributeType: types.ScalarAttributeTypeB}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(attrID), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return opError("create table", err)
	}
	if err := s.waitActive(ctx); err != nil {
		return err
	}
	if s.opts.TTL == TTLUntouched {
		return nil
	}
	_, err = s.api.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName:               s.table,
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(attrTTL), Enabled: aws.Bool(true)},
	})
	if err != nil && !ttlAlreadyOn(err) {
		return opError("enable TTL", err)
	}
	return nil
}

// ttlAlreadyOn reports whether UpdateTimeToLive failed only because TTL
// is already on, as a second Migrate finds it.
func ttlAlreadyOn(err error) bool {
	var v interface{ ErrorMessage() string }
	return errors.As(err, &v) && strings.Contains(strings.ToLower(v.ErrorMessage()), "already enabled")
}

// waitActive polls the table until it is active or ctx is done.
func (s *Store) waitActive(ctx context.Context) error {
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		out, err := s.api.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: s.table})
		if err != nil {
			return opError("describe table", err)
		}
		if out.Table != nil && out.Table.TableStatus == types.TableStatusActive {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("dynamostore: waiting for table %s to be active: %w", *s.table, ctx.Err())
		case <-time.After(delay):
		}
	}
}
