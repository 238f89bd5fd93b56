package dynamostore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
)

// churn is an API through which another owner takes the key just before
// each of the caller's writes, and gives it back just before each of the
// caller's reads, rounds times: every write the caller chose from a read
// meets a record that changed since, which is free again when it looks.
type churn struct {
	dynamostore.API
	other  *dynamostore.Store
	key    string
	rounds int
	lease  backends.Lease
	held   bool
}

func (c *churn) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if c.rounds > 0 && !c.held {
		res, err := c.other.Acquire(ctx, backends.AcquireRequest{Key: c.key, Owner: "other", LeaseTTL: time.Minute, Retention: time.Hour})
		if err != nil {
			return nil, err
		}
		if res.Status != backends.StatusAcquired {
			return nil, fmt.Errorf("churn: the other owner could not take the key: %v", res.Status)
		}
		c.lease, c.held = res.Lease, true
		c.rounds--
	}
	return c.API.UpdateItem(ctx, in, opts...)
}

func (c *churn) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	if c.held {
		if err := c.other.Release(ctx, c.lease); err != nil {
			return nil, err
		}
		c.held = false
	}
	return c.API.GetItem(ctx, in, opts...)
}

// Under churn a writer keeps trying, pausing a little longer at random
// each time, and takes the key once the churn stops; it gives up, with an
// error the caller retries, only after MaxRounds writes.
func TestAcquireUnderChurn(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	api := sv.client(nil)
	base := newStore(t, api, dynamostore.Options{})
	other, err := dynamostore.New(api, base.Options())
	require.NoError(t, err)
	req := func(key string) backends.AcquireRequest {
		return backends.AcquireRequest{Key: key, Owner: "me", LeaseTTL: time.Minute, Retention: time.Hour}
	}

	// The first write is a guess (a new key) and the second follows the
	// record; each later one was chosen from a record that had changed.
	calm := &churn{API: api, other: other, key: "k1", rounds: dynamostore.MaxRounds - 1}
	s, err := dynamostore.New(calm, base.Options())
	require.NoError(t, err)
	res, err := s.Acquire(ctx(t), req("k1"))
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, res.Status)
	require.EqualValues(t, dynamostore.MaxRounds, res.Lease.Token, "every other owner's acquisition counted before it")

	storm := &churn{API: api, other: other, key: "k2", rounds: 1000}
	s, err = dynamostore.New(storm, base.Options())
	require.NoError(t, err)
	_, err = s.Acquire(ctx(t), req("k2"))
	require.ErrorContains(t, err, fmt.Sprintf("the record changed under each of %d writes", dynamostore.MaxRounds))
	require.NotErrorIs(t, err, backends.ErrRejected, "transient: the middleware retries it")
	require.Equal(t, 1000-dynamostore.MaxRounds, storm.rounds)

	// A context that ends during a pause ends the Acquire.
	cancelled := &churn{API: api, other: other, key: "k3", rounds: 1000}
	s, err = dynamostore.New(cancelled, base.Options())
	require.NoError(t, err)
	c, cancel := context.WithCancel(ctx(t))
	cancel()
	_, err = s.Acquire(c, req("k3"))
	require.ErrorIs(t, err, context.Canceled)
}

func TestContentionPause(t *testing.T) {
	t.Parallel()
	require.Zero(t, dynamostore.ContentionPause(0), "the guess")
	require.Zero(t, dynamostore.ContentionPause(1), "the write the record showed")
	for round, ceiling := range map[int]time.Duration{2: 2 * time.Millisecond, 3: 4 * time.Millisecond, 8: 128 * time.Millisecond, 15: 128 * time.Millisecond} {
		var longest time.Duration
		for range 2000 {
			d := dynamostore.ContentionPause(round)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.Less(t, d, ceiling, "round %d", round)
			longest = max(longest, d)
		}
		require.Greater(t, longest, ceiling/2, "round %d: pauses spread up to the ceiling", round)
	}
}
