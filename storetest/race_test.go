package storetest_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/storetest"
)

// A racer retries an Acquire that failed as a store may when other callers
// keep taking the key (dynamostore gives up after a bounded number of
// writes): the race runs to its end.
func TestRaceRetriesFailedAcquire(t *testing.T) {
	s, err := memstore.New(memstore.Options{})
	require.NoError(t, err)
	var calls atomic.Int64
	storetest.Race{Racers: 8, Keys: 2, Wins: 60, LeaseTTL: 100 * time.Millisecond,
		Store: func(testing.TB, int) backends.Store { return &giveUp{Store: s, calls: &calls} }}.Run(t)
}

// giveUp is a store whose every fifth Acquire fails after the call, as
// dynamostore's does when the record changed under each of its writes.
type giveUp struct {
	backends.Store
	calls *atomic.Int64
}

func (g *giveUp) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	if g.calls.Add(1)%5 == 0 {
		return backends.AcquireResult{}, errors.New("giveUp: the record changed under each write")
	}
	return g.Store.Acquire(ctx, req)
}
