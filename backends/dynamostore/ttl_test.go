package dynamostore_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
)

// Every write sets the ttl attribute, the Unix second after which
// DynamoDB's Time to Live may delete the item, past forget_ms and the skew
// margin, so that no process still counts the record as present when it
// goes: the store rounds up to a whole second and adds one more.
func TestTTLAttribute(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	api := sv.client(nil)
	s := newStore(t, api, dynamostore.Options{})
	c := &clock{now: recordedAt}
	dynamostore.SetClock(s, c.Now)
	skew := dynamostore.DefaultClockSkew.Milliseconds()
	const retention = 24 * time.Hour

	// raw reads the record's forget_ms and ttl as stored.
	raw := func(key string) (forget, ttl int64) {
		t.Helper()
		out, err := api.GetItem(ctx(t), &dynamodb.GetItemInput{
			TableName:      aws.String(s.Options().Table),
			Key:            map[string]types.AttributeValue{"id": &types.AttributeValueMemberB{Value: []byte(key)}},
			ConsistentRead: aws.Bool(true),
		})
		require.NoError(t, err)
		n := func(name string) int64 {
			v, ok := out.Item[name].(*types.AttributeValueMemberN)
			require.True(t, ok, "%s is a number", name)
			i, err := strconv.ParseInt(v.Value, 10, 64)
			require.NoError(t, err)
			return i
		}
		return n("forget_ms"), n("ttl")
	}
	// check checks the record's ttl, and that forget_ms is the expiry the
	// store reports, want.
	check := func(key, after string, want time.Time) {
		t.Helper()
		forget, ttl := raw(key)
		require.Equal(t, want.UnixMilli(), forget, "forget_ms after %s", after)
		rec, err := s.Inspect(ctx(t), key)
		require.NoError(t, err)
		require.True(t, rec.ExpiresAt.Equal(want), "the record's ExpiresAt after %s", after)
		require.Equal(t, (forget+skew+999)/1000+1, ttl, "ttl after %s", after)
	}

	res, err := s.Acquire(ctx(t), backends.AcquireRequest{Key: "done", Owner: "a", LeaseTTL: 30 * time.Second, Retention: retention})
	require.NoError(t, err)
	check("done", "Acquire", recordedAt.Add(30*time.Second+retention))
	// recordedAt is …413.589 s: the record is forgotten at …443.589 s a
	// day later, by every clock within the margin at …444.589 s; rounded
	// up and one more, …446 s.
	_, ttl := raw("done")
	require.Equal(t, int64(1741944446+86400), ttl)

	c.Advance(10*time.Second + 250*time.Millisecond)
	require.NoError(t, s.Renew(ctx(t), res.Lease, time.Minute))
	check("done", "Renew", c.Now().Add(time.Minute+retention))

	c.Advance(2500 * time.Millisecond)
	require.NoError(t, s.Complete(ctx(t), res.Lease, []byte("out")))
	check("done", "Complete", c.Now().Add(retention))

	res, err = s.Acquire(ctx(t), backends.AcquireRequest{Key: "released", Owner: "a", LeaseTTL: 30 * time.Second, Retention: retention})
	require.NoError(t, err)
	c.Advance(1700 * time.Millisecond)
	require.NoError(t, s.Release(ctx(t), res.Lease))
	check("released", "Release", c.Now().Add(retention))
}
