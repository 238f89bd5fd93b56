package memstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func TestConformanceFakeClock(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		clock := newFakeClock()
		s, err := memstore.New(memstore.Options{Now: clock.Now})
		require.NoError(t, err)
		return storetest.Fixture{Store: s, Advance: clock.Advance}
	})
}

// The real-clock run proves the suite's sleeping path, which server-clock
// stores depend on, against the simplest store.
func TestConformanceRealClock(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	require.NoError(t, err)
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		return storetest.Fixture{Store: store, Tick: 50 * time.Millisecond}
	})
}

func TestPruneRemovesExpiredRecords(t *testing.T) {
	clock := newFakeClock()
	s, err := memstore.New(memstore.Options{Now: clock.Now, PruneInterval: time.Minute})
	require.NoError(t, err)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		res, err := s.Acquire(ctx, backends.AcquireRequest{Key: k, Owner: "o", LeaseTTL: time.Second, Retention: time.Second})
		require.NoError(t, err)
		require.NoError(t, s.Complete(ctx, res.Lease, nil))
	}
	require.Equal(t, 3, memstore.Len(s))

	clock.Advance(30 * time.Second)
	_, err = s.Acquire(ctx, backends.AcquireRequest{Key: "d", Owner: "o", LeaseTTL: time.Hour, Retention: time.Hour})
	require.NoError(t, err)
	require.Equal(t, 4, memstore.Len(s), "no sweep before the prune interval has passed")

	clock.Advance(31 * time.Second)
	_, err = s.Acquire(ctx, backends.AcquireRequest{Key: "e", Owner: "o", LeaseTTL: time.Hour, Retention: time.Hour})
	require.NoError(t, err)
	require.Equal(t, 2, memstore.Len(s), "the sweep removed a, b and c and kept the live d and e")
}

// New refuses a negative PruneInterval; zero means the default.
func TestNewValidates(t *testing.T) {
	_, err := memstore.New(memstore.Options{PruneInterval: -time.Second})
	require.ErrorIs(t, err, backends.ErrInvalidOptions)
	require.ErrorContains(t, err, "memstore: ")
	s, err := memstore.New(memstore.Options{})
	require.NoError(t, err)
	require.Equal(t, time.Minute, s.Options().PruneInterval, "the defaults applied")
	require.NotNil(t, s.Options().Now)
}
