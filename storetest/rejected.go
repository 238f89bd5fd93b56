package storetest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// CheckRejected checks a store whose table is missing: Acquire fails with
// an error wrapping backends.ErrRejected that mentions code (the server's
// own), and the middleware fails the delivery after that one call
// instead of retrying until Timing.StoreTimeout.
func CheckRejected(t *testing.T, s backends.Store, code string) {
	t.Helper()
	_, err := s.Acquire(context.Background(), backends.AcquireRequest{Key: "k", Owner: "o", LeaseTTL: time.Second})
	require.ErrorIs(t, err, backends.ErrRejected)
	require.ErrorContains(t, err, code)

	var calls atomic.Int64
	idem, err := idempotency.New(idempotency.Config{Store: Counted(s, &calls), Namespace: "t",
		Timing: idempotency.Timing{StoreTimeout: time.Minute, StoreBackoff: idempotency.Backoff{Max: 10 * time.Millisecond}}})
	require.NoError(t, err)
	_, err = idem.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("k", nil))
	require.ErrorIs(t, err, idempotency.ErrStore)
	require.ErrorIs(t, err, backends.ErrRejected)
	require.EqualValues(t, 1, calls.Load(), "not retried")
}
