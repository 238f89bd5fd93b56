package middleware_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	"github.com/watermill-idempotency/idempotency/middleware"
	"github.com/watermill-idempotency/idempotency/storetest"
)

// acquireCounter counts the Acquire calls made to the store it wraps: a
// duplicate of a completed key makes no other call.
type acquireCounter struct {
	backends.Store
	n atomic.Int64
}

func (s *acquireCounter) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	s.n.Add(1)
	return s.Store.Acquire(ctx, req)
}

func withCache(size int, ttl time.Duration) func(c *middleware.Config) {
	return func(c *middleware.Config) { c.CompletedCache = middleware.CompletedCache{Size: size, TTL: ttl} }
}

// echo is a handler that counts its runs and produces one message.
func echo(runs *atomic.Int64) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return []*message.Message{message.NewMessage("out-"+m.UUID, []byte("result"))}, nil
	}
}

func TestCompletedCacheHit(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run("cache="+strconv.FormatBool(on), func(t *testing.T) {
			store := &acquireCounter{Store: newMemstore()}
			fn := func(*middleware.Config) {}
			if on {
				fn = withCache(10, time.Hour)
			}
			m, counters := newMiddleware(t, store, fn)
			var runs atomic.Int64
			h := m.Middleware(echo(&runs))
			_, err := h(newMsg("k1", "p"))
			require.NoError(t, err)
			before := store.n.Load()

			out, err := h(newMsg("k1", "p"))
			require.NoError(t, err)
			require.Len(t, out, 1, "the stored output is replayed")
			require.Equal(t, "result", string(out[0].Payload))
			require.EqualValues(t, 1, runs.Load())
			require.EqualValues(t, 1, counters.Count(middleware.OutcomeDuplicate))
			if on {
				require.Equal(t, before, store.n.Load(), "a cached completion makes no store call")
			} else {
				require.Equal(t, before+1, store.n.Load())
			}
		})
	}
}

// A second process, its own middleware on the same store (Redis), learns
// the completion from the store once and then answers from its cache.
func TestCompletedCacheFromStoreRedis(t *testing.T) {
	rs, err := redisstore.New(testserver.RedisClient(t), redisstore.Options{Prefix: testserver.Unique("cache") + ":"})
	require.NoError(t, err)
	a, _ := newMiddleware(t, rs, withCache(10, time.Hour))
	storeB := &acquireCounter{Store: rs}
	b, counters := newMiddleware(t, storeB, withCache(10, time.Hour))
	var runs atomic.Int64
	_, err = a.Middleware(echo(&runs))(newMsg("k1", "p"))
	require.NoError(t, err)

	hb := b.Middleware(echo(&runs))
	for range 5 {
		out, err := hb(newMsg("k1", "p"))
		require.NoError(t, err)
		require.Len(t, out, 1)
	}
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 1, storeB.n.Load(), "only the first copy asks the store")
	require.EqualValues(t, 5, counters.Count(middleware.OutcomeDuplicate))
}

// An operator's delete is not seen until the entry's TTL has passed; then
// the work runs again.
func TestCompletedCacheOperatorDelete(t *testing.T) {
	store := newMemstore()
	m, _ := newMiddleware(t, store, withCache(10, 200*time.Millisecond))
	var runs atomic.Int64
	h := m.Middleware(echo(&runs))
	_, err := h(newMsg("k1", "p"))
	require.NoError(t, err)
	require.NoError(t, store.Delete(context.Background(), "test:k1"))

	_, err = h(newMsg("k1", "p"))
	require.NoError(t, err)
	require.EqualValues(t, 1, runs.Load(), "within the TTL, the cache answers")

	waitFor(t, "the handler to run again after the TTL", func() bool {
		_, err := h(newMsg("k1", "p"))
		require.NoError(t, err)
		return runs.Load() == 2
	})
}

func TestCompletedCacheBounded(t *testing.T) {
	store := &acquireCounter{Store: newMemstore()}
	m, _ := newMiddleware(t, store, withCache(3, time.Hour))
	var runs atomic.Int64
	h := m.Middleware(echo(&runs))
	for i := range 10 {
		_, err := h(newMsg("k"+strconv.Itoa(i), "p"))
		require.NoError(t, err)
		require.LessOrEqual(t, middleware.CompletedCacheLen(m), 3)
	}
	// The three most recent are cached, the oldest are asked of the store.
	before := store.n.Load()
	for i := 7; i < 10; i++ {
		_, err := h(newMsg("k"+strconv.Itoa(i), "p"))
		require.NoError(t, err)
	}
	require.Equal(t, before, store.n.Load())
	_, err := h(newMsg("k0", "p"))
	require.NoError(t, err)
	require.Equal(t, before+1, store.n.Load())
	require.EqualValues(t, 10, runs.Load())
}

func TestCompletedCacheFingerprintMismatch(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run("cache="+strconv.FormatBool(on), func(t *testing.T) {
			store := &acquireCounter{Store: newMemstore()}
			m, counters := newMiddleware(t, store, func(c *middleware.Config) {
				c.Fingerprint = keyfunc.PayloadHash()
				if on {
					withCache(10, time.Hour)(c)
				}
			})
			var runs atomic.Int64
			h := m.Middleware(echo(&runs))
			_, err := h(newMsg("k1", "p"))
			require.NoError(t, err)
			before := store.n.Load()
			_, err = h(newMsg("k1", "another"))
			require.ErrorIs(t, err, middleware.ErrFingerprintMismatch)
			require.EqualValues(t, 1, counters.Count(middleware.OutcomeFingerprintMismatch))
			require.EqualValues(t, 1, runs.Load())
			if on {
				require.Equal(t, before, store.n.Load())
			}
		})
	}
}

func TestCompletedCacheInvalidConfig(t *testing.T) {
	for _, c := range []middleware.CompletedCache{{Size: -1, TTL: time.Second}, {Size: 1, TTL: -time.Second}, {Size: 1}} {
		_, err := middleware.New(middleware.Config{Store: newMemstore(), CompletedCache: c})
		require.True(t, errors.Is(err, middleware.ErrInvalidConfig), "%+v: %v", c, err)
	}
}

func TestStormMemstoreCompletedCache(t *testing.T) {
	store := newMemstore()
	storetest.Storm{
		Instances: 8, Keys: 2000, Copies: 3,
		Store:     func(testing.TB, int) backends.Store { return store },
		Configure: func(c *middleware.Config) { c.CompletedCache = middleware.CompletedCache{Size: 1000, TTL: time.Minute} },
	}.Run(t)
}

func TestStormMemstoreFlakyStoreCompletedCache(t *testing.T) {
	store := newMemstore()
	storetest.Storm{
		Instances: 8, Keys: 2000, Copies: 3, Flaky: 0.05,
		Store:     func(testing.TB, int) backends.Store { return store },
		Configure: func(c *middleware.Config) { c.CompletedCache = middleware.CompletedCache{Size: 1000, TTL: time.Minute} },
	}.Run(t)
}
