package redisstore_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

// store02 runs the scripts of redisstore 0.2.0 (testdata/v0.2.0): a
// process not yet upgraded. Its records have the layout of this
// version's; only who writes what changed.
type store02 struct {
	t                                 *testing.T
	client                            *redis.Client
	prefix                            string
	acquire, complete, release, renew *redis.Script
}

func newStore02(t *testing.T, client *redis.Client, prefix string) *store02 {
	read := func(name string) string {
		src, err := os.ReadFile("testdata/v0.2.0/" + name + ".lua")
		require.NoError(t, err)
		return string(src)
	}
	script := func(name string) *redis.Script { return redis.NewScript(read("acquired") + read(name)) }
	return &store02{t: t, client: client, prefix: prefix,
		acquire: script("acquire"), complete: script("complete"), release: script("release"), renew: script("renew")}
}

// take runs 0.2.0's acquire.lua (the path of every Acquire of 0.2.0 on
// a key that exists) and returns its outcome and record.
func (o *store02) take(key, owner string, ttl time.Duration) (int64, string) {
	o.t.Helper()
	vals, err := o.acquire.Run(context.Background(), o.client, []string{o.prefix + key},
		owner, ttl.Milliseconds(), time.Hour.Milliseconds(), "", (ttl + time.Hour).Milliseconds(), "0.2").Slice()
	require.NoError(o.t, err)
	return vals[0].(int64), vals[1].(string)
}

// end runs 0.2.0's complete.lua, release.lua or renew.lua for the lease of
// owner with token, and reports whether it held.
func (o *store02) end(s *redis.Script, key, owner string, token int64, args ...any) bool {
	o.t.Helper()
	n, err := s.Run(context.Background(), o.client, []string{o.prefix + key},
		append([]any{"p" + strconv.FormatInt(token, 10) + ":" + owner + "\x00"}, args...)...).Int64()
	require.NoError(o.t, err)
	return n == 1
}

// During a rolling upgrade from 0.2.0, each version takes over, waits for,
// completes and replays the other's leases, with fencing tokens that only
// grow, and this version's Complete, Release and Renew keep the
// acquisition time of a lease 0.2.0 took.
func TestRollingUpgradeFrom02(t *testing.T) {
	client := testserver.RedisClient(t)
	prefix := testserver.Unique("upgrade02-test:")
	s := newStorePrefixed(t, client, prefix)
	old := newStore02(t, client, prefix)
	ctx := context.Background()
	req := func(key, owner string, ttl time.Duration) backends.AcquireRequest {
		return backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: ttl, Retention: time.Hour}
	}

	// This version takes a key; 0.2.0 waits for it, then replays its
	// completion.
	res, err := s.Acquire(ctx, req("new-held", "new-a", time.Minute))
	require.NoError(t, err)
	outcome, _ := old.take("new-held", "old-a", time.Minute)
	require.EqualValues(t, 2, outcome, "0.2.0 sees the lease in progress")
	require.NoError(t, s.Complete(ctx, res.Lease, []byte("out")))
	outcome, v := old.take("new-held", "old-a", time.Minute)
	require.EqualValues(t, 3, outcome, "0.2.0 sees it completed")
	require.Contains(t, v, "out")

	// 0.2.0 takes a key; this version waits for it; a release by 0.2.0
	// hands it over with the next token.
	outcome, _ = old.take("old-held", "old-b", time.Minute)
	require.EqualValues(t, 1, outcome)
	res, err = s.Acquire(ctx, req("old-held", "new-b", time.Minute))
	require.NoError(t, err)
	require.Equal(t, backends.StatusInProgress, res.Status)
	require.Greater(t, res.Remaining, 50*time.Second)
	require.True(t, old.end(old.release, "old-held", "old-b", 1))
	res, err = s.Acquire(ctx, req("old-held", "new-b", time.Minute))
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, res.Status)
	require.EqualValues(t, 2, res.Lease.Token)
	require.False(t, res.Lease.Takeover)

	// This version releases; 0.2.0 takes it with the next token.
	require.NoError(t, s.Release(ctx, res.Lease))
	outcome, v = old.take("old-held", "old-c", time.Minute)
	require.EqualValues(t, 1, outcome)
	require.Regexp(t, "^p3:old-c\x00", v)

	// A 0.2.0 lease that expired: taken over by this version; 0.2.0's
	// holder has lost it.
	outcome, _ = old.take("old-expired", "old-d", 20*time.Millisecond)
	require.EqualValues(t, 1, outcome)
	time.Sleep(50 * time.Millisecond)
	res, err = s.Acquire(ctx, req("old-expired", "new-d", time.Minute))
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, res.Status)
	require.True(t, res.Lease.Takeover)
	require.EqualValues(t, 2, res.Lease.Token)
	require.False(t, old.end(old.complete, "old-expired", "old-d", 1, ""), "0.2.0's holder lost the lease")
	// and a lease of this version that expired: taken over by 0.2.0.
	res, err = s.Acquire(ctx, req("new-expired", "new-e", 20*time.Millisecond))
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	outcome, v = old.take("new-expired", "old-e", time.Minute)
	require.EqualValues(t, 1, outcome)
	require.Regexp(t, "^p2:old-e\x00", v)
	require.ErrorIs(t, s.Complete(ctx, res.Lease, nil), backends.ErrLeaseLost)

	// An operator's Complete, Release or Renew of this version on a lease
	// 0.2.0 holds (idem complete, idem release) keeps when it was
	// acquired.
	for _, end := range []string{"complete", "release", "renew"} {
		key := "old-" + end
		outcome, _ = old.take(key, "old-f", time.Minute)
		require.EqualValues(t, 1, outcome)
		before, err := s.Inspect(ctx, key)
		require.NoError(t, err)
		require.WithinDuration(t, before.AcquiredAt.Add(time.Minute), before.LeaseExpiresAt, time.Millisecond)
		lease := backends.Lease{Key: key, Owner: "old-f", Token: 1}
		switch end {
		case "complete":
			require.NoError(t, s.Complete(ctx, lease, nil))
		case "release":
			require.NoError(t, s.Release(ctx, lease))
		case "renew":
			require.NoError(t, s.Renew(ctx, lease, 2*time.Minute))
		}
		after, err := s.Inspect(ctx, key)
		require.NoError(t, err)
		require.True(t, before.AcquiredAt.Equal(after.AcquiredAt), "%s: AcquiredAt %v, was %v", end, after.AcquiredAt, before.AcquiredAt)
		if end == "renew" {
			require.True(t, old.end(old.complete, key, "old-f", 1, ""), "0.2.0's holder completes after the renewal")
			after, err = s.Inspect(ctx, key)
			require.NoError(t, err)
			require.True(t, before.AcquiredAt.Equal(after.AcquiredAt))
		}
	}
}
