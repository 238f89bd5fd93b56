package redisstore_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	"github.com/watermill-idempotency/idempotency/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newStore(t *testing.T, client redis.UniversalClient) *redisstore.Store {
	t.Helper()
	return newStorePrefixed(t, client, testserver.Unique("redisstore-test:"))
}

func newStorePrefixed(t *testing.T, client redis.UniversalClient, prefix string) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// The full suite against the shared Redis ($REDIS_ADDR), each test under
// its own key prefix.
func TestConformance(t *testing.T) {
	client := testserver.RedisClient(t)
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		return storetest.Fixture{Store: newStore(t, client)}
	})
}

// The full suite against a real three-master Redis Cluster
// ($REDIS_CLUSTER_ADDRS).
func TestConformanceCluster(t *testing.T) {
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testserver.ClusterAddrs(t)})
	t.Cleanup(func() { _ = client.Close() })
	base := testserver.Unique("redisstore-cluster:")
	t.Run("suite", func(t *testing.T) { // returns once the parallel tests are done
		storetest.Run(t, func(t *testing.T) storetest.Fixture {
			return storetest.Fixture{Store: newStorePrefixed(t, client, testserver.Unique(base))}
		})
	})

	// The suite's keys spread over every master: the store is not leaning
	// on one slot. (Records completed with a retention are still there.)
	var used atomic.Int32
	require.NoError(t, client.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, base+"*", 1000).Iterator()
		if iter.Next(ctx) {
			used.Add(1)
		}
		return iter.Err()
	}))
	require.EqualValues(t, 3, used.Load())
}

func TestNewRejectsNilClient(t *testing.T) {
	s, err := redisstore.New(nil, redisstore.Options{})
	require.ErrorIs(t, err, backends.ErrNilClient)
	require.EqualError(t, err, "redisstore: backends: nil client")
	require.Nil(t, s)
	for name, client := range map[string]redis.UniversalClient{
		"client": (*redis.Client)(nil), "cluster": (*redis.ClusterClient)(nil), "ring": (*redis.Ring)(nil),
	} {
		_, err := redisstore.New(client, redisstore.Options{})
		require.ErrorIs(t, err, backends.ErrNilClient, "a typed nil %s", name)
	}
}

// wrapped is a client of another type than go-redis's own.
type wrapped struct{ *redis.Client }

// A client of another type would lose the store capabilities it needs
// the concrete client for (listing, the pool's size, waking duplicates):
// New refuses it rather than drop them.
func TestNewRejectsOtherClients(t *testing.T) {
	client := testserver.RedisClient(t)
	_, err := redisstore.New(wrapped{client}, redisstore.Options{})
	require.ErrorIs(t, err, backends.ErrInvalidOptions)
	require.ErrorContains(t, err, "redisstore_test.wrapped")
	_, err = redisstore.New(client, redisstore.Options{Coalescing: redisstore.CoalesceOff + 1})
	require.ErrorIs(t, err, backends.ErrInvalidOptions, "an unknown Coalescing")
	s, err := redisstore.New(client, redisstore.Options{})
	require.NoError(t, err)
	require.Equal(t, redisstore.Options{Prefix: redisstore.DefaultPrefix}, s.Options(), "the defaults applied")
}

// One string per key, under the prefix, in the layout docs/redis.md
// describes; it expires one retention after the lease, then one
// retention after the completion. The acquisition time is the lease's
// TTL, relative to the key's expiry, until a script moves the expiry.
func TestKeyLayout(t *testing.T) {
	client := testserver.RedisClient(t)
	s, err := redisstore.New(client, redisstore.Options{Prefix: "layout-test:"})
	require.NoError(t, err)
	ctx := context.Background()
	key := testserver.Unique("k")
	rkey := "layout-test:" + key
	t.Cleanup(func() { client.Del(context.Background(), rkey) })
	get := func() string { t.Helper(); return client.Get(ctx, rkey).Val() }
	// acquired cuts the acquisition time, ms since the epoch, out of the
	// record v at head and checks it is AcquiredAt.
	acquired := func(v, head string) (string, time.Time) {
		t.Helper()
		require.True(t, strings.HasPrefix(v, head), "%q starts with %q", v, head)
		ms, rest, _ := strings.Cut(v[len(head):], ":")
		n, err := strconv.ParseInt(ms, 10, 64)
		require.NoError(t, err, "%q", v)
		rec, err := s.Inspect(ctx, key)
		require.NoError(t, err)
		require.True(t, time.UnixMilli(n).Equal(rec.AcquiredAt), "acquired %d, Inspect says %v", n, rec.AcquiredAt)
		return rest, rec.AcquiredAt
	}

	res, err := s.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: "o", LeaseTTL: 10 * time.Second, Retention: time.Hour,
		Fingerprint: []byte("f:p"), Origin: "message_uuid=u-1 handler=h"})
	require.NoError(t, err)
	require.Equal(t, "string", client.Type(ctx, rkey).Val(), "one string per key, under the prefix")
	require.Equal(t, "p1:o\x001:3600000:~10000:message_uuid=u-1 handler=h\x003:f:p", get())
	ttl := client.PTTL(ctx, rkey).Val()
	require.Greater(t, ttl, time.Hour, "kept for the lease plus the retention")
	require.LessOrEqual(t, ttl, time.Hour+10*time.Second)
	rec, err := s.Inspect(ctx, key)
	require.NoError(t, err)
	first := rec.AcquiredAt

	require.NoError(t, s.Release(ctx, res.Lease))
	rest, at := acquired(get(), "r1:o\x001:3600000:")
	require.Equal(t, "message_uuid=u-1 handler=h\x003:f:p", rest)
	require.True(t, first.Equal(at), "the release wrote the acquisition time it had: %v, was %v", at, first)
	res, err = s.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: "o2", LeaseTTL: 10 * time.Second, Retention: time.Hour, Origin: "u-2"})
	require.NoError(t, err)
	require.Equal(t, "p2:o2\x002:3600000:~10000:u-2\x003:f:p", get())

	before := time.Now().Truncate(time.Microsecond)
	require.NoError(t, s.Complete(ctx, res.Lease, []byte("out:put")))
	after := time.Now()
	rest, _ = acquired(get(), "c2:o2\x002:3600000:")
	rest, ok := strings.CutPrefix(rest, "u-2\x003:f:p")
	require.True(t, ok, "%q", rest)
	secs, rest, _ := strings.Cut(rest, ":")
	usecs, out, _ := strings.Cut(rest, ":")
	require.Equal(t, "out:put", out)
	sec, err := strconv.ParseInt(secs, 10, 64)
	require.NoError(t, err)
	usec, err := strconv.ParseInt(usecs, 10, 64)
	require.NoError(t, err)
	completed := time.Unix(sec, usec*1000)
	require.False(t, completed.Before(before) || completed.After(after),
		"the completion's time, the completing process's clock: %v, not within [%v, %v]", completed, before, after)
	ttl = client.PTTL(ctx, rkey).Val()
	require.Greater(t, ttl, 59*time.Minute, "kept for the retention from the completion")
	require.LessOrEqual(t, ttl, time.Hour)

	// A renewal and a re-entrant Acquire write the time too, once.
	key2 := testserver.Unique("k")
	rkey = "layout-test:" + key2
	key = key2
	t.Cleanup(func() { client.Del(context.Background(), rkey) })
	res, err = s.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: "o", LeaseTTL: 10 * time.Second, Retention: time.Hour})
	require.NoError(t, err)
	require.Equal(t, "p1:o\x001:3600000:~10000:\x000:", get())
	rec, err = s.Inspect(ctx, key)
	require.NoError(t, err)
	first = rec.AcquiredAt
	require.NoError(t, s.Renew(ctx, res.Lease, 20*time.Second))
	rest, at = acquired(get(), "p1:o\x001:3600000:")
	require.Equal(t, "\x000:", rest)
	require.True(t, first.Equal(at))
	require.NoError(t, s.Renew(ctx, res.Lease, 20*time.Second))
	_, at = acquired(get(), "p1:o\x001:3600000:")
	require.True(t, first.Equal(at))
	again, err := s.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: "o", LeaseTTL: 30 * time.Second, Retention: 2 * time.Hour, Origin: "ignored"})
	require.NoError(t, err)
	require.True(t, again.Reentrant)
	rest, at = acquired(get(), "p1:o\x001:7200000:")
	require.Equal(t, "\x000:", rest, "the re-entrant Acquire keeps the origin it first gave")
	require.True(t, first.Equal(at))
}

// clientWithHook wraps a real client with a go-redis hook.
func clientWithHook(t *testing.T, addr string, hook redis.Hook, opts ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: addr}
	for _, fn := range opts {
		fn(o)
	}
	c := redis.NewClient(o)
	if hook != nil {
		c.AddHook(hook)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// loseReplies is a hook that lets a command reach Redis and run, then
// reports a timeout in place of its reply: the ambiguous failure.
type loseReplies struct{ n atomic.Int32 }

func (h *loseReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *loseReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *loseReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if (err == nil || errors.Is(err, redis.Nil)) && h.n.Add(-1) >= 0 {
			err = errors.New("read tcp: i/o timeout")
			cmd.SetErr(err)
		}
		return err
	}
}

func TestAmbiguousAcquireRetryGetsTheLeaseBack(t *testing.T) {
	shared := testserver.RedisClient(t)
	hook := &loseReplies{}
	client := clientWithHook(t, shared.Options().Addr, hook)
	s := newStore(t, client)
	ctx := context.Background()
	req := backends.AcquireRequest{Key: "k", Owner: "owner-1", LeaseTTL: time.Minute, Retention: time.Minute}

	require.NoError(t, client.Ping(ctx).Err()) // connect first: the hook is for the script's reply
	hook.n.Store(1)
	_, err := s.Acquire(ctx, req)
	require.ErrorContains(t, err, "i/o timeout", "the reply was lost")
	rec, err := s.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "owner-1", rec.Owner, "but Redis applied the acquire")

	res, err := s.Acquire(ctx, req)
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, res.Status, "the retry is not told the key is in progress")
	require.True(t, res.Reentrant, "%+v", res)
	require.Equal(t, 1, res.Lease.Attempt)

	other, err := s.Acquire(ctx, backends.AcquireRequest{Key: "k", Owner: "owner-2", LeaseTTL: time.Minute, Retention: time.Minute})
	require.NoError(t, err)
	require.Equal(t, backends.StatusInProgress, other.Status)
}

func TestScriptFlushIsHarmless(t *testing.T) {
	r := testserver.StartRedis(t)
	client := clientWithHook(t, r.Addr(), nil)
	s := newStore(t, client)
	ctx := context.Background()
	res, err := s.Acquire(ctx, backends.AcquireRequest{Key: "k", Owner: "o", LeaseTTL: time.Minute, Retention: time.Minute})
	require.NoError(t, err)

	require.NoError(t, client.ScriptFlush(ctx).Err())
	require.NoError(t, s.Renew(ctx, res.Lease, time.Minute), "NOSCRIPT falls back to EVAL")
	require.NoError(t, client.ScriptFlush(ctx).Err())
	require.NoError(t, s.Complete(ctx, res.Lease, nil))
	require.NoError(t, client.ScriptFlush(ctx).Err())
	rec, err := s.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, backends.StateCompleted, rec.State)
}

// List and Count pipeline their scripts as EVALSHA: on a server that has
// not loaded the script, or has flushed it, the calls go again as EVAL.
func TestListAndCountAfterScriptFlush(t *testing.T) {
	r := testserver.StartRedis(t)
	client := clientWithHook(t, r.Addr(), nil)
	s := newStore(t, client)
	ctx := context.Background()
	for _, k := range []string{"ns:a", "ns:b"} {
		_, err := s.Acquire(ctx, backends.AcquireRequest{Key: k, Owner: "o", LeaseTTL: time.Minute, Retention: time.Minute})
		require.NoError(t, err)
	}

	require.NoError(t, client.ScriptFlush(ctx).Err())
	page, err := s.List(ctx, backends.ListRequest{Namespace: "ns", Limit: 10})
	require.NoError(t, err)
	require.Len(t, page.Records, 2)
	require.Equal(t, "ns:a", page.Records[0].Key)
	require.Equal(t, backends.StateInProgress, page.Records[1].State)
	require.NoError(t, client.ScriptFlush(ctx).Err())
	counts, err := s.Count(ctx, "ns")
	require.NoError(t, err)
	require.EqualValues(t, 2, counts.InProgress)
}

// A hung server (paused with SIGSTOP): every call returns by its context's
// deadline with an error, none hangs.
func TestHungServerHonoursContextDeadline(t *testing.T) {
	r := testserver.StartRedis(t)
	client := clientWithHook(t, r.Addr(), nil, func(o *redis.Options) {
		o.ContextTimeoutEnabled = true // without it go-redis bounds reads by ReadTimeout only
		o.ReadTimeout = time.Minute
		o.MaxRetries = -1
	})
	s := newStore(t, client)
	require.NoError(t, client.Ping(context.Background()).Err())
	r.Pause()
	t.Cleanup(r.Resume)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Acquire(ctx, backends.AcquireRequest{Key: "k", Owner: "o", LeaseTTL: time.Minute, Retention: time.Minute})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 5*time.Second, "returned at the deadline, not hung")
}

// Every connection of a one-connection pool is busy: the store's call
// fails with the pool's timeout rather than waiting forever.
func TestPoolExhaustion(t *testing.T) {
	shared := testserver.RedisClient(t)
	client := clientWithHook(t, shared.Options().Addr, nil, func(o *redis.Options) {
		o.PoolSize = 1
		o.PoolTimeout = 100 * time.Millisecond
		o.ReadTimeout = -1 // no read deadline, so the blocking call below holds its connection
		o.MaxRetries = -1
	})
	s := newStore(t, client)
	blockKey := testserver.Unique("blocker")
	blocked := make(chan struct{})
	go func() {
		defer close(blocked)
		client.BLPop(context.Background(), 5*time.Second, blockKey) // holds the only connection
	}()
	require.Eventually(t, func() bool {
		st := client.PoolStats()
		return st.TotalConns == 1 && st.IdleConns == 0
	}, 5*time.Second, time.Millisecond, "the blocking call holds the only connection")

	_, err := s.Acquire(context.Background(), backends.AcquireRequest{Key: "k", Owner: "o", LeaseTTL: time.Minute, Retention: time.Minute})
	require.ErrorIs(t, err, redis.ErrPoolTimeout)
	<-blocked
	res, err := s.Acquire(context.Background(), backends.AcquireRequest{Key: "k", Owner: "o", LeaseTTL: time.Minute, Retention: time.Minute})
	require.NoError(t, err, "the pool recovers once the connection is back")
	require.Equal(t, backends.StatusAcquired, res.Status)
}

// Redis restarted without persistence forgets everything: completed keys,
// leases, fencing tokens. The test pins down exactly what a user sees, as
// docs/redis.md describes it.
func TestRestartWithoutPersistenceLosesState(t *testing.T) {
	r := testserver.StartRedis(t)
	client := clientWithHook(t, r.Addr(), nil)
	s := newStore(t, client)
	ctx := context.Background()
	req := func(owner string) backends.AcquireRequest {
		return backends.AcquireRequest{Key: "k", Owner: owner, LeaseTTL: time.Minute, Retention: time.Hour}
	}

	done, err := s.Acquire(ctx, backends.AcquireRequest{Key: "done", Owner: "a", LeaseTTL: time.Minute, Retention: time.Hour})
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, done.Lease, nil))
	var held backends.Lease
	for i := range 3 { // push the token up to 3
		res, err := s.Acquire(ctx, req("holder-"+string(rune('a'+i))))
		require.NoError(t, err)
		held = res.Lease
		if i < 2 {
			require.NoError(t, s.Release(ctx, held))
		}
	}
	require.EqualValues(t, 3, held.Token)

	r.Restart()

	require.ErrorIs(t, s.Renew(ctx, held, time.Minute), backends.ErrLeaseLost, "the holder learns at its next renewal")
	again, err := s.Acquire(ctx, backends.AcquireRequest{Key: "done", Owner: "b", LeaseTTL: time.Minute, Retention: time.Hour})
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, again.Status, "a completed key is forgotten: its duplicate runs again")
	res, err := s.Acquire(ctx, req("new"))
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Lease.Token, "fencing tokens start again from 1")
}

// The store reports its client's pool size, with go-redis's defaults
// applied, so the middleware can keep half of it for lease keeping.
func TestPoolSize(t *testing.T) {
	addr := testserver.RedisClient(t).Options().Addr
	for name, tc := range map[string]struct {
		client redis.UniversalClient
		want   int
	}{
		"client":         {redis.NewClient(&redis.Options{Addr: addr, PoolSize: 7}), 7},
		"default client": {redis.NewClient(&redis.Options{Addr: addr}), 10 * runtime.GOMAXPROCS(0)},
		"cluster client": {redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, PoolSize: 5}), 5},
		"ring":           {redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, PoolSize: 3}), 3},
	} {
		s, err := redisstore.New(tc.client, redisstore.Options{})
		require.NoError(t, err)
		require.Equal(t, tc.want, s.PoolSize(), name)
		require.NoError(t, tc.client.Close())
	}
}

// On a Ring the store lists its records and wakes a waiting duplicate,
// as on the other clients.
func TestRing(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": testserver.RedisClient(t).Options().Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	s := newStore(t, ring)
	ctx := context.Background()
	held, err := s.Acquire(ctx, backends.AcquireRequest{Key: "ns:k", Owner: "holder", LeaseTTL: time.Minute, Retention: time.Minute})
	require.NoError(t, err)
	changed, stop, ok := s.Watch(ctx, "ns:k")
	require.True(t, ok, "a Ring watches")
	defer stop()
	page, err := s.List(ctx, backends.ListRequest{Namespace: "ns", Limit: 10})
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	require.Equal(t, "ns:k", page.Records[0].Key)
	require.NoError(t, s.Complete(ctx, held.Lease, nil))
	select {
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("the completion did not wake the watch")
	}
}

// serverError is an error reply of Redis.
type serverError string

func (e serverError) Error() string { return string(e) }
func (serverError) RedisError()     {}

// noSetGet is a hook that answers SET ... NX ... GET as a server before
// Redis 7.0 does, and counts the SETs it sees.
type noSetGet struct{ sets atomic.Int32 }

func (h *noSetGet) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *noSetGet) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *noSetGet) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "set" {
			h.sets.Add(1)
			err := serverError("ERR syntax error")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// On a server that refuses SET NX GET (before Redis 7.0), Acquire takes
// the script instead, at once and from then on.
func TestServerWithoutSetNXGet(t *testing.T) {
	h := &noSetGet{}
	client := clientWithHook(t, testserver.RedisClient(t).Options().Addr, h)
	s := newStore(t, client)
	ctx := context.Background()
	for i, key := range []string{"a", "b", "c"} {
		res, err := s.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: "o", LeaseTTL: time.Minute, Retention: time.Minute})
		require.NoError(t, err, "acquire %d", i)
		require.Equal(t, backends.StatusAcquired, res.Status)
		require.EqualValues(t, 1, res.Lease.Token)
		require.NoError(t, s.Complete(ctx, res.Lease, []byte(key)))
		res, err = s.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: "o2", LeaseTTL: time.Minute, Retention: time.Minute})
		require.NoError(t, err)
		require.Equal(t, backends.StatusCompleted, res.Status)
		require.Equal(t, key, string(res.Output))
	}
	require.EqualValues(t, 1, h.sets.Load(), "SET NX GET tried once")
}
