package redisstore_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
	"github.com/watermill-idempotency/idempotency/storetest"
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
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "t", LeaseTTL: ttl})
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
	require.ErrorIs(t, err, backends.ErrLeaseLost, "nacked")
	require.ErrorIs(t, cause, backends.ErrLeaseLost)

	// The server and this test share a clock (same machine), so the two
	// times compare: the handler was stopped while the lease still held.
	rec, err := store.Inspect(context.Background(), "t:m1")
	require.NoError(t, err)
	require.True(t, cancelledAt.Before(rec.LeaseExpiresAt),
		"cancelled at %v, lease expired at %v", cancelledAt.Format(time.StampMilli), rec.LeaseExpiresAt.Format(time.StampMilli))
}

// The storm on Redis, under the overload the library must survive: eight
// service instances, each with its own Redis client and a pool of only 10
// connections, receive three copies of each of 2,000 keys at once, and
// every copy is handled concurrently (GoChannel delivers them all at
// once); some handlers fail their first attempt. The configuration is the
// default one. Every key's effect is applied exactly once through a fenced
// sink, no delivery is acked before its key's effect, and completions are
// recorded (storetest.Storm.Run). make test-stress runs it with every core
// loaded by CPU hogs; docs/reliability.md has the figures.
func TestStormRedis(t *testing.T) {
	redisStorm(t, testserver.RedisClient(t).Options().Addr)
}

// redisStorm runs the storm on the Redis at addr, each instance with its
// own client and a pool of 10 connections, and checks its report.
func redisStorm(t *testing.T, addr string) {
	prefix := testserver.Unique("storm:")
	storetest.Storm{
		Instances: 8, Keys: 2000, Copies: 3,
		Store: func(t testing.TB, _ int) backends.Store {
			client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 10})
			t.Cleanup(func() { _ = client.Close() })
			s, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
			require.NoError(t, err)
			return s
		},
	}.Run(t)
}

// The happy path costs exactly two store round trips: Acquire and
// Complete; a duplicate of completed work costs one.
func TestHappyPathRoundTrips(t *testing.T) {
	var calls atomic.Int64
	store := storetest.Counted(newStore(t, testserver.RedisClient(t)), &calls)
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "rt"})
	require.NoError(t, err)
	h := idem.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	_, err = h(message.NewMessage("m1", nil))
	require.NoError(t, err)
	require.EqualValues(t, 2, calls.Load())
	_, err = h(message.NewMessage("m1", nil))
	require.NoError(t, err)
	require.EqualValues(t, 3, calls.Load())
}

// The same storm with a slow store: every call reaches Redis 100ms late,
// as on an overloaded or distant server (STORM_LATENCY overrides it). Each
// instance's pool of 10 connections then serves only 100 calls a second,
// while 750 deliveries arrive at each instance at once: new work queues
// for connections for seconds, past go-redis's pool timeout, as it does in
// production when the store falls behind. Renewals and completions of
// running handlers must still get through. docs/reliability.md compares
// this storm with and without the acquisition bound and the retried
// completion.
func TestStormRedisSlowStore(t *testing.T) {
	latency := 100 * time.Millisecond
	if v := os.Getenv("STORM_LATENCY"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err)
		latency = d
	}
	redisStorm(t, testserver.StartLatencyProxy(t, testserver.RedisClient(t).Options().Addr, latency))
}

// heldConn holds back, while keeping its pool connection, every command
// that names a "slow-" key until hold is closed: a server slow to answer
// new work.
type heldConn struct {
	net.Conn
	hold    <-chan struct{}
	blocked *atomic.Int32
}

func (c heldConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("slow-")) {
		c.blocked.Add(1)
		<-c.hold
		c.blocked.Add(-1)
	}
	return c.Conn.Write(b)
}

// renewCounter counts renewals.
type renewCounter struct {
	backends.Store
	renews atomic.Int64
}

func (r *renewCounter) Renew(ctx context.Context, l backends.Lease, ttl time.Duration) error {
	r.renews.Add(1)
	return r.Store.Renew(ctx, l, ttl)
}

// PoolSize forwards the store's pool size, as a wrapper should.
func (r *renewCounter) PoolSize() int { return r.Store.(backends.PoolSizer).PoolSize() }

// New deliveries whose acquisitions hang take connections from a pool of
// four. With MaxConcurrentAcquires below the pool size (set, or by default
// half the pool the store reports), a running handler's lease is still
// renewed and its completion recorded: the stuck acquisitions' round
// trips hold back nothing else. The control, with the bound above the
// pool size and every call its own round trip (CoalesceOff, so that each
// hung acquisition holds a connection of its own), shows what the bound
// prevents: every connection is taken by new work, the renewals cannot be
// sent, and the handler's lease is lost.
func TestLeaseKeptWhileAcquiresSaturateThePool(t *testing.T) {
	for _, tc := range []struct {
		name         string
		bound, taken int
		kept         bool
		coalescing   redisstore.Coalescing
	}{
		{"bound below the pool", 1, 1, true, redisstore.CoalesceConcurrent},
		{"default: half the pool", 0, 2, true, redisstore.CoalesceConcurrent},
		{"control: bound above the pool", 64, 4, false, redisstore.CoalesceOff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := testserver.RedisClient(t).Options().Addr
			hold := make(chan struct{})
			var blocked atomic.Int32
			client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 4,
				Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
					c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					return heldConn{Conn: c, hold: hold, blocked: &blocked}, nil
				}})
			var unblock sync.Once
			t.Cleanup(func() { unblock.Do(func() { close(hold) }); _ = client.Close() })
			plain, err := redisstore.New(client, redisstore.Options{Prefix: testserver.Unique("pool-test:"), Coalescing: tc.coalescing})
			require.NoError(t, err)
			t.Cleanup(func() { _ = plain.Close() })
			store := &renewCounter{Store: plain}
			counters := &idempotency.Counters{}
			idem, err := idempotency.New(idempotency.Config{
				Store: store, Namespace: "pool", Observer: counters,
				LeaseTTL:              3 * time.Second, // renewed every second; a 300ms margin
				MaxConcurrentAcquires: tc.bound,
			})
			require.NoError(t, err)

			running, finish := make(chan struct{}), make(chan struct{})
			var cancelled atomic.Bool
			held := make(chan error, 1)
			go func() {
				_, err := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
					close(running)
					select {
					case <-finish:
					case <-msg.Context().Done():
						cancelled.Store(true)
						<-finish
					}
					return nil, nil
				})(message.NewMessage("held", nil))
				held <- err
			}()
			<-running

			var slow sync.WaitGroup
			for i := range 16 {
				slow.Go(func() {
					_, _ = idem.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(
						message.NewMessage(fmt.Sprintf("slow-%d", i), nil))
				})
			}
			require.Eventually(t, func() bool { return int(blocked.Load()) == tc.taken }, 10*time.Second, time.Millisecond,
				"new acquisitions hold %d connections", tc.taken)
			renews := store.renews.Load()
			if tc.kept {
				require.Eventually(t, func() bool { return store.renews.Load() >= renews+3 }, time.Minute, 10*time.Millisecond, "renewals go on")
			} else {
				require.Eventually(t, cancelled.Load, time.Minute, 10*time.Millisecond, "the lease is lost")
			}
			close(finish)
			err = <-held
			unblock.Do(func() { close(hold) })
			slow.Wait()
			if tc.kept {
				require.NoError(t, err)
				require.False(t, cancelled.Load())
				require.EqualValues(t, 17, counters.Count(idempotency.OutcomeProcessed))
			} else {
				require.ErrorIs(t, err, backends.ErrLeaseLost)
				require.EqualValues(t, 1, counters.Count(idempotency.OutcomeLeaseLost))
			}
		})
	}
}

// A record key of another type (someone else's data under the prefix) is
// an error retrying cannot fix: the middleware fails the delivery after
// one call.
func TestWrongTypeIsRejected(t *testing.T) {
	client := testserver.RedisClient(t)
	prefix := testserver.Unique("wrongtype:")
	s, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	require.NoError(t, err)
	require.NoError(t, client.Set(context.Background(), prefix+"t:k", "not a hash", time.Minute).Err())
	_, err = s.Acquire(context.Background(), backends.AcquireRequest{Key: "t:k", Owner: "o", LeaseTTL: time.Second})
	require.ErrorIs(t, err, backends.ErrRejected)

	var calls atomic.Int64
	store := storetest.Counted(s, &calls)
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "t", Timing: idempotency.Timing{StoreBackoff: idempotency.Backoff{Max: 10 * time.Millisecond}}})
	require.NoError(t, err)
	_, err = idem.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("k", nil))
	require.ErrorIs(t, err, idempotency.ErrStore)
	require.ErrorIs(t, err, backends.ErrRejected)
	require.EqualValues(t, 1, calls.Load(), "not retried")
}

// Watermill's Deduplicator on Redis (middleware.KeyRepository): of many
// instances checking one key at once, each with a client of its own,
// exactly one finds it new.
func TestKeyRepositoryOnRedis(t *testing.T) {
	prefix := testserver.Unique("keyrepo:")
	var fresh atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		client := redis.NewClient(&redis.Options{Addr: testserver.RedisClient(t).Options().Addr})
		t.Cleanup(func() { _ = client.Close() })
		s, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		repo, err := idempotency.NewKeyRepository(s, time.Minute)
		require.NoError(t, err)
		wg.Go(func() {
			for i := range 50 {
				dup, err := repo.IsDuplicate(context.Background(), fmt.Sprintf("k%d", i))
				require.NoError(t, err)
				if !dup {
					fresh.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 50, fresh.Load(), "each of 50 keys new once")
}
