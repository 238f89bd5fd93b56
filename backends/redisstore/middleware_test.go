package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/internal/fleet"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// Redis stops answering while a handler runs. The keeper's renewals time
// out; the handler's context is cancelled before the lease could have
// expired on the server, and the message is nacked.
func TestRedisUnreachableMidHandlerCancelsBeforeExpiry(t *testing.T) {
	r := testserver.StartRedis(t)
	client := clientWithHook(t, r.Addr(), nil, func(o *redis.Options) {
		o.ContextTimeoutEnabled = true
		o.MaxRetries = -1
	})
	store := newStore(t, client)
	const ttl = 2 * time.Second // a 200ms margin: room for a loaded, race-instrumented test run
	idem, err := middleware.New(middleware.Config{Store: store, Namespace: "t", LeaseTTL: ttl})
	require.NoError(t, err)

	var cancelledAt time.Time
	var cause error
	_, err = idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		r.Pause()
		<-msg.Context().Done()
		cancelledAt, cause = time.Now(), context.Cause(msg.Context())
		r.Resume()
		return nil, msg.Context().Err()
	})(message.NewMessage("m1", nil))
	require.ErrorIs(t, err, middleware.ErrLeaseLost, "nacked")
	require.ErrorIs(t, cause, middleware.ErrLeaseLost)

	// The server and this test share a clock (same machine), so the two
	// times compare: the handler was stopped while the lease still held.
	rec, err := store.Inspect(context.Background(), "t:m1")
	require.NoError(t, err)
	require.True(t, cancelledAt.Before(rec.LeaseExpiresAt),
		"cancelled at %v, lease expired at %v", cancelledAt.Format(time.StampMilli), rec.LeaseExpiresAt.Format(time.StampMilli))
}

// Eight service instances, each its own router and subscriber, share one
// Redis store. Every key is delivered three times, to three instances at
// once; some handlers fail on their first attempt. Every key's work
// completes exactly once, every failure is retried, and every delivery
// is acked in the end.
func TestManyConsumersOneRedisStore(t *testing.T) {
	const instances, keys, copies = 8, 2000, 3
	client := testserver.RedisClient(t)
	store := newStore(t, client)

	var (
		mu          sync.Mutex
		completions = make(map[string]int, keys)
		attempts    sync.Map // key -> *atomic.Int32
		failures    atomic.Int32
	)
	handler := func(msg *message.Message) error {
		key := string(msg.Payload)
		n, _ := attempts.LoadOrStore(key, new(atomic.Int32))
		if n.(*atomic.Int32).Add(1) == 1 && len(key)%3 == 0 { // some keys fail their first attempt
			failures.Add(1)
			return errors.New("injected failure")
		}
		mu.Lock()
		completions[key]++
		mu.Unlock()
		return nil
	}

	f := fleet.Start(t, instances, func(_ int, counters *middleware.Counters) message.NoPublishHandlerFunc {
		idem, err := middleware.New(middleware.Config{
			Store:        store,
			Key:          payloadKey{},
			LeaseTTL:     5 * time.Second,
			PollInterval: 5 * time.Millisecond,
			Observer:     counters,
		})
		require.NoError(t, err)
		return func(msg *message.Message) error {
			_, err := idem.Middleware(func(m *message.Message) ([]*message.Message, error) { return nil, handler(m) })(msg)
			return err
		}
	})
	// Each copy of a key goes to a different instance, with a new message
	// UUID, as a producer retry would.
	f.PublishCopies(t, keys, copies, func(k int) []byte { return []byte(fmt.Sprintf("order-%d", k)) })
	f.WaitAcked(t, keys*copies, 2*time.Minute)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, completions, keys, "no key lost")
	for k, n := range completions {
		require.Equal(t, 1, n, "key %s completed %d times", k, n)
	}
	processed, failed := f.Count(middleware.OutcomeProcessed, middleware.OutcomeProcessedNotRecorded), f.Count(middleware.OutcomeHandlerFailed)
	require.EqualValues(t, keys, processed, "outcomes: %v", f.Outcomes())
	require.EqualValues(t, failures.Load(), failed)
	require.Positive(t, failed, "failures were injected")
	t.Logf("%d deliveries over %d instances: %d processed, %d duplicates, %d failures retried",
		keys*copies, instances, processed, f.Count(middleware.OutcomeDuplicate), failed)
}

// payloadKey uses the payload as the key: the order id.
type payloadKey struct{}

func (payloadKey) Key(msg *message.Message) (string, error) { return string(msg.Payload), nil }

var _ backends.Store = (*countingStore)(nil)

// countingStore counts store calls, to express the middleware's cost in
// round trips.
type countingStore struct {
	backends.Store
	calls atomic.Int64
}

func (c *countingStore) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	c.calls.Add(1)
	return c.Store.Acquire(ctx, req)
}

func (c *countingStore) Complete(ctx context.Context, l backends.Lease, r time.Duration, out []byte) error {
	c.calls.Add(1)
	return c.Store.Complete(ctx, l, r, out)
}

func (c *countingStore) Renew(ctx context.Context, l backends.Lease, ttl time.Duration) error {
	c.calls.Add(1)
	return c.Store.Renew(ctx, l, ttl)
}

// The happy path costs exactly two store round trips: Acquire and
// Complete; a duplicate of completed work costs one.
func TestHappyPathRoundTrips(t *testing.T) {
	store := &countingStore{Store: newStore(t, testserver.RedisClient(t))}
	idem, err := middleware.New(middleware.Config{Store: store, Namespace: "rt"})
	require.NoError(t, err)
	h := idem.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	_, err = h(message.NewMessage("m1", nil))
	require.NoError(t, err)
	require.EqualValues(t, 2, store.calls.Load())
	_, err = h(message.NewMessage("m1", nil))
	require.NoError(t, err)
	require.EqualValues(t, 3, store.calls.Load())
}
