package dynamostore

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// batchGetMax is the most keys one BatchGetItem reads.
const batchGetMax = 100

// List implements [backends.Lister]. DynamoDB keeps a table's items in
// the order of their keys' hashes, so every page scans the whole table
// (strongly consistent, without the outputs) for the namespace's keys,
// sorts those after the cursor, and reads the page's records with
// BatchGetItem: a page costs a read of every item's key and times. It is
// meant for operators, not for a hot path.
func (s *Store) List(ctx context.Context, req backends.ListRequest) (backends.ListPage, error) {
	if err := storekit.ValidateList(req); err != nil {
		return backends.ListPage{}, err
	}
	keys, err := s.scanKeys(ctx, storekit.ListPrefix(req.Namespace), req.State)
	if err != nil {
		return backends.ListPage{}, err
	}
	return storekit.Page(ctx, req, keys, batchGetMax, s.getMany)
}

// Count implements [backends.Lister], scanning as List does.
func (s *Store) Count(ctx context.Context, namespace string) (backends.Counts, error) {
	var c backends.Counts
	now := s.now().UnixMilli()
	err := s.scan(ctx, storekit.ListPrefix(namespace), func(it item) {
		if st, ok := s.judge(it, now); ok {
			storekit.AddCount(&c, st, it.acquiredAt())
		}
	})
	return c, err
}

// scanKeys returns the keys that start with prefix of the records present
// and, unless state is 0, in that state.
func (s *Store) scanKeys(ctx context.Context, prefix string, state backends.State) ([]string, error) {
	var keys []string
	now := s.now().UnixMilli()
	err := s.scan(ctx, prefix, func(it item) {
		if st, ok := s.judge(it, now); ok && (state == 0 || st == state) {
			keys = append(keys, it.key)
		}
	})
	return keys, err
}

// scan calls fn with the key, state and times of every item whose key
// starts with prefix, paging through the whole table.
func (s *Store) scan(ctx context.Context, prefix string, fn func(item)) error {
	proj := `#id, #state, #acquired, #lease, #forget`
	in := &dynamodb.ScanInput{TableName: s.table, ConsistentRead: aws.Bool(true), ProjectionExpression: aws.String(proj)}
	e := bind(nil, proj)
	if prefix != "" {
		filter := `begins_with(#id, :prefix)`
		e = bind(map[string]types.AttributeValue{":prefix": bin([]byte(prefix))}, proj, filter)
		in.FilterExpression = aws.String(filter)
	}
	in.ExpressionAttributeNames, in.ExpressionAttributeValues = e.Names, e.Values
	for {
		out, err := s.api.Scan(ctx, in)
		if err != nil {
			return opError("scan", err)
		}
		for _, av := range out.Items {
			it, err := decode(av)
			if err != nil {
				return err
			}
			fn(it)
		}
		if len(out.LastEvaluatedKey) == 0 {
			return nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// getMany reads the records of keys (at most batchGetMax) with strongly
// consistent reads and returns those still present, in the order of keys.
func (s *Store) getMany(ctx context.Context, keys []string) ([]backends.Record, error) {
	want := make([]map[string]types.AttributeValue, len(keys))
	for i, k := range keys {
		want[i] = keyOf(k)
	}
	items := make(map[string]item, len(keys))
	pending := map[string]types.KeysAndAttributes{*s.table: {Keys: want, ConsistentRead: aws.Bool(true)}}
	for len(pending) > 0 {
		out, err := s.api.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: pending})
		if err != nil {
			return nil, opError("list", err)
		}
		for _, av := range out.Responses[*s.table] {
			it, err := decode(av)
			if err != nil {
				return nil, err
			}
			items[it.key] = it
		}
		if pending = out.UnprocessedKeys; len(pending) > 0 {
			select { // throttled: back off before asking for the rest
			case <-ctx.Done():
				return nil, opError("list", ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	now := s.now().UnixMilli()
	recs := make([]backends.Record, 0, len(keys))
	for _, k := range keys {
		it, ok := items[k]
		if !ok {
			continue // deleted since the scan
		}
		if st, ok := s.judge(it, now); ok {
			recs = append(recs, s.record(it, st))
		}
	}
	return recs, nil
}
