package middleware_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/middleware"
)

var _ wmiddleware.ExpiringKeyRepository = (*middleware.KeyRepository)(nil)

// Many checks of one key at once, as instances sharing the store make:
// exactly one finds it new; after the window it is new again.
func TestKeyRepository(t *testing.T) {
	clock := &fakeClock{now: time.Now()}
	store, err := memstore.New(memstore.Options{Now: clock.Now})
	require.NoError(t, err)
	repo, err := middleware.NewKeyRepository(store, time.Minute)
	require.NoError(t, err)
	var fresh atomic.Int32
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			dup, err := repo.IsDuplicate(context.Background(), "k")
			require.NoError(t, err)
			if !dup {
				fresh.Add(1)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, fresh.Load())
	dup, err := repo.IsDuplicate(context.Background(), "k")
	require.NoError(t, err)
	require.True(t, dup)
	clock.advance(time.Minute + time.Second)
	dup, err = repo.IsDuplicate(context.Background(), "k")
	require.NoError(t, err)
	require.False(t, dup, "forgotten after the window")

	// Behind Watermill's Deduplicator, as a drop-in repository.
	dedup := &wmiddleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return string(m.Payload), nil }, Repository: repo, Timeout: time.Second}
	var ran int
	h := dedup.Middleware(func(*message.Message) ([]*message.Message, error) { ran++; return nil, nil })
	for range 3 {
		_, err := h(message.NewMessage("u", []byte("order-1")))
		require.NoError(t, err)
	}
	require.Equal(t, 1, ran)
}

func TestNewKeyRepositoryValidates(t *testing.T) {
	for name, window := range map[string]time.Duration{"zero": 0, "negative": -time.Second} {
		_, err := middleware.NewKeyRepository(newMemstore(), window)
		require.ErrorIs(t, err, middleware.ErrInvalidConfig, name)
	}
	_, err := middleware.NewKeyRepository((*memstore.Store)(nil), time.Minute)
	require.ErrorIs(t, err, middleware.ErrInvalidConfig)
}

// fakeClock is a clock the tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
