package dynamostore_test

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
	"github.com/watermill-idempotency/idempotency/storetest"
)

// The acquisition race of every store (storetest.Race): 32 goroutines, each
// with its own client, on 4 keys.
func TestAcquireStorm32(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	opts := newStore(t, sv.client(nil), dynamostore.Options{ClockSkew: skew}).Options()
	storetest.Race{Racers: 32, Keys: 4, Wins: 120, LeaseTTL: time.Second,
		Store: func(t testing.TB, _ int) backends.Store {
			s, err := dynamostore.New(sv.client(&http.Transport{}), opts)
			require.NoError(t, err)
			return s
		}}.Run(t)
}

// The storm of the other stores, on DynamoDB (dynalite): eight instances,
// each with its own client, three copies of each of 300 keys at once,
// the default configuration, effects through a fenced sink.
func TestStormDynamo(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	opts := newStore(t, sv.client(nil), dynamostore.Options{}).Options()
	storetest.Storm{
		Instances: 8, Keys: 300, Copies: 3,
		Store: func(t testing.TB, _ int) backends.Store {
			s, err := dynamostore.New(sv.client(&http.Transport{}), opts)
			require.NoError(t, err)
			return s
		},
	}.Run(t)
}

// The same storm while one store call in ten fails as a network would,
// half of them after DynamoDB applied the write: the acquisitions whose
// answer was lost come back to their owner as re-entrant ones.
func TestStormDynamoFlaky(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	opts := newStore(t, sv.client(nil), dynamostore.Options{}).Options()
	storetest.Storm{
		Instances: 8, Keys: 200, Copies: 3, Flaky: 0.1,
		Store: func(t testing.TB, _ int) backends.Store {
			s, err := dynamostore.New(sv.client(&http.Transport{}), opts)
			require.NoError(t, err)
			return s
		},
	}.Run(t)
}

// A table that does not exist is an error retrying cannot fix: the store
// marks it, and the middleware fails the delivery after one call instead
// of retrying until Timing.StoreTimeout.
func TestMissingTableIsRejected(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	s, err := dynamostore.New(sv.client(nil), dynamostore.Options{Table: "never_created"})
	require.NoError(t, err)
	storetest.CheckRejected(t, s, "ResourceNotFoundException")
}

// The largest record the store promises fits DynamoDB's 400 KB item: the
// longest key, owner, fingerprint and origin with the longest output.
func TestLargestRecordFits(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	s := newStore(t, sv.client(nil), dynamostore.Options{})
	key := strings.Repeat("k", backends.MaxKeyBytes)
	fp := bytes.Repeat([]byte{0xfe}, backends.MaxFingerprintBytes)
	res, err := s.Acquire(ctx(t), backends.AcquireRequest{
		Key: key, Owner: strings.Repeat("o", backends.MaxOwnerBytes), LeaseTTL: time.Minute,
		Retention: backends.MaxDuration, Fingerprint: fp, Origin: strings.Repeat("g", backends.MaxOriginBytes),
	})
	require.NoError(t, err)
	out := bytes.Repeat([]byte{0xff}, dynamostore.MaxOutputBytes)
	require.NoError(t, s.Complete(ctx(t), res.Lease, out))
	rec, err := s.Inspect(ctx(t), key)
	require.NoError(t, err)
	require.Equal(t, out, rec.Output)
	require.Equal(t, fp, rec.Fingerprint)

	_, err = s.Acquire(ctx(t), backends.AcquireRequest{Key: "k2", Owner: "o", LeaseTTL: time.Minute, Fingerprint: append(fp, 1)})
	require.ErrorIs(t, err, backends.ErrInvalidRequest, "a fingerprint over MaxFingerprintBytes")
	require.ErrorContains(t, err, "fingerprint of 4097 bytes")
}

// Through the middleware, an output over the store's limit is the
// middleware's typed error, and the key is released for the redelivery.
func TestOutputOverLimitThroughMiddleware(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	s := newStore(t, sv.client(nil), dynamostore.Options{})
	idem, err := idempotency.New(idempotency.Config{Store: s, Namespace: "t"})
	require.NoError(t, err)
	_, err = idem.Middleware(func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("out", make([]byte, dynamostore.MaxOutputBytes))}, nil
	})(message.NewMessage("k", nil))
	require.ErrorIs(t, err, idempotency.ErrOutputTooLarge)
	rec, err := s.Inspect(ctx(t), "t:k")
	require.NoError(t, err)
	require.Equal(t, backends.StateReleased, rec.State)
	require.False(t, errors.Is(err, backends.ErrRejected))
}
