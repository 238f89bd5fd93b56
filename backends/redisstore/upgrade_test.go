package redisstore_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

// oldStore runs the scripts of redisstore 0.1.0 (testdata/v0.1.0), which
// kept each record as a hash: a process not yet upgraded, during a
// rolling upgrade.
type oldStore struct {
	t                                 *testing.T
	client                            *redis.Client
	prefix                            string
	acquire, complete, release, renew *redis.Script
}

func newOldStore(t *testing.T, client *redis.Client, prefix string) *oldStore {
	script := func(name string) *redis.Script {
		src, err := os.ReadFile("testdata/v0.1.0/" + name + ".lua")
		require.NoError(t, err)
		return redis.NewScript(string(src))
	}
	return &oldStore{t: t, client: client, prefix: prefix,
		acquire: script("acquire"), complete: script("complete"), release: script("release"), renew: script("renew")}
}

// take acquires key for owner and returns the token, failing the test
// unless 0.1.0 acquired it.
func (o *oldStore) take(key, owner string, ttl time.Duration, fp string) int64 {
	o.t.Helper()
	vals, err := o.acquire.Run(context.Background(), o.client, []string{o.prefix + key}, owner, ttl.Milliseconds(), time.Hour.Milliseconds(), fp).Slice()
	require.NoError(o.t, err)
	require.EqualValues(o.t, 1, vals[0], "0.1.0 acquired %s", key)
	return vals[1].(int64)
}

func (o *oldStore) run(s *redis.Script, key string, args ...any) (int64, error) {
	return s.Run(context.Background(), o.client, []string{o.prefix + key}, args...).Int64()
}

// During a rolling upgrade, this version reads the records 0.1.0 wrote
// (hashes) and answers from them as 0.1.0 would; a lease it takes on one
// replaces it with a record of its own layout and the next fencing token.
// 0.1.0 meeting a record of this version fails with WRONGTYPE, a store
// error: it never acquires, completes, renews or releases it, so no work
// runs twice.
func TestRollingUpgrade(t *testing.T) {
	client := testserver.RedisClient(t)
	prefix := testserver.Unique("upgrade-test:")
	s := newStorePrefixed(t, client, prefix)
	old := newOldStore(t, client, prefix)
	ctx := context.Background()
	req := func(key, owner, fp string) backends.AcquireRequest {
		r := backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: time.Minute, Retention: time.Hour}
		if fp != "" {
			r.Fingerprint = []byte(fp)
		}
		return r
	}

	// A key 0.1.0 completed: a duplicate is dropped, with its output and
	// fingerprint.
	token := old.take("ns:done", "old-a", time.Minute, "fp-1")
	n, err := old.run(old.complete, "ns:done", "old-a", token, "the output")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	res, err := s.Acquire(ctx, req("ns:done", "new-a", "fp-2"))
	require.NoError(t, err)
	require.Equal(t, backends.StatusCompleted, res.Status)
	require.Equal(t, "the output", string(res.Output))
	require.Equal(t, "fp-1", string(res.Fingerprint))
	require.WithinDuration(t, time.Now(), res.CompletedAt, time.Minute)
	rec, err := s.Inspect(ctx, "ns:done")
	require.NoError(t, err)
	require.Equal(t, backends.StateCompleted, rec.State)
	require.Equal(t, "old-a", rec.Owner)
	require.EqualValues(t, 1, rec.Token)
	require.True(t, rec.LeaseExpiresAt.Equal(rec.CompletedAt), "its lease ended with the completion, as on every record")
	require.Empty(t, rec.Origin, "0.1.0 kept no origin")
	require.Zero(t, rec.AcquiredAt, "nor the acquisition time")

	// A key 0.1.0 completed without a fingerprint adopts the first one
	// given, as it would have.
	token = old.take("ns:done-nofp", "old-b", time.Minute, "")
	_, err = old.run(old.complete, "ns:done-nofp", "old-b", token, "")
	require.NoError(t, err)
	res, err = s.Acquire(ctx, req("ns:done-nofp", "new-b", "fp-3"))
	require.NoError(t, err)
	require.Equal(t, backends.StatusCompleted, res.Status)
	require.Equal(t, "fp-3", string(res.Fingerprint))

	// A key 0.1.0 holds: in progress for this version, which cannot end
	// the lease; the holder completes it with its own scripts.
	token = old.take("ns:held", "old-c", time.Minute, "")
	res, err = s.Acquire(ctx, req("ns:held", "new-c", ""))
	require.NoError(t, err)
	require.Equal(t, backends.StatusInProgress, res.Status)
	require.Positive(t, res.Remaining)
	require.LessOrEqual(t, res.Remaining, time.Minute)
	oldLease := backends.Lease{Key: "ns:held", Owner: "old-c", Token: token, Attempt: 1}
	require.ErrorIs(t, s.Renew(ctx, oldLease, time.Minute), backends.ErrLeaseLost)
	require.ErrorIs(t, s.Release(ctx, oldLease), backends.ErrLeaseLost)
	require.ErrorIs(t, s.Complete(ctx, oldLease, nil), backends.ErrLeaseLost)
	rec, err = s.Inspect(ctx, "ns:held")
	require.NoError(t, err)
	require.Equal(t, backends.StateInProgress, rec.State, "the calls above changed nothing")
	require.Equal(t, "old-c", rec.Owner)
	counts, err := s.Count(ctx, "ns")
	require.NoError(t, err)
	require.Equal(t, backends.Counts{InProgress: 1, Completed: 2}, counts)
	n, err = old.run(old.complete, "ns:held", "old-c", token, "")
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "0.1.0 completes the key it holds")
	res, err = s.Acquire(ctx, req("ns:held", "new-c", ""))
	require.NoError(t, err)
	require.Equal(t, backends.StatusCompleted, res.Status)

	// A key 0.1.0 released: taken with the next token; 0.1.0 can no
	// longer acquire it.
	token = old.take("ns:released", "old-d", time.Minute, "")
	_, err = old.run(old.release, "ns:released", "old-d", token)
	require.NoError(t, err)
	rec, err = s.Inspect(ctx, "ns:released")
	require.NoError(t, err)
	require.Equal(t, backends.StateReleased, rec.State)
	require.True(t, rec.LeaseExpiresAt.Add(time.Hour).Equal(rec.ExpiresAt), "its lease ended with the release, a retention before the record does")
	newReq := req("ns:released", "new-d", "")
	newReq.Origin = "message_uuid=d handler=h"
	res, err = s.Acquire(ctx, newReq)
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, res.Status)
	require.False(t, res.Lease.Takeover)
	require.EqualValues(t, token+1, res.Lease.Token)
	require.Equal(t, 2, res.Lease.Attempt)
	require.Equal(t, "string", client.Type(ctx, prefix+"ns:released").Val(), "rewritten in this version's layout")
	rec, err = s.Inspect(ctx, "ns:released")
	require.NoError(t, err)
	require.Equal(t, "message_uuid=d handler=h", rec.Origin)
	require.WithinDuration(t, rec.AcquiredAt.Add(time.Minute), rec.LeaseExpiresAt, time.Millisecond)
	_, err = old.acquire.Run(ctx, client, []string{prefix + "ns:released"}, "old-e", 60000, 3600000, "").Slice()
	require.ErrorContains(t, err, "WRONGTYPE", "0.1.0 fails on this version's record")
	require.NoError(t, s.Complete(ctx, res.Lease, nil))

	// A key whose 0.1.0 lease expired: taken over with the next token;
	// the old holder's calls fail and change nothing.
	token = old.take("ns:expired", "old-f", 50*time.Millisecond, "")
	time.Sleep(100 * time.Millisecond)
	res, err = s.Acquire(ctx, req("ns:expired", "new-f", ""))
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, res.Status)
	require.True(t, res.Lease.Takeover)
	require.EqualValues(t, token+1, res.Lease.Token)
	for name, script := range map[string]*redis.Script{"complete": old.complete, "release": old.release} {
		_, err = old.run(script, "ns:expired", "old-f", token, "")
		require.ErrorContains(t, err, "WRONGTYPE", "0.1.0's %s", name)
	}
	_, err = old.run(old.renew, "ns:expired", "old-f", token, 60000)
	require.ErrorContains(t, err, "WRONGTYPE", "0.1.0's renew")
	rec, err = s.Inspect(ctx, "ns:expired")
	require.NoError(t, err)
	require.Equal(t, backends.StateInProgress, rec.State)
	require.Equal(t, "new-f", rec.Owner)

	// A key this version holds: 0.1.0 cannot acquire it.
	_, err = s.Acquire(ctx, req("ns:new", "new-g", ""))
	require.NoError(t, err)
	_, err = old.acquire.Run(ctx, client, []string{prefix + "ns:new"}, "old-g", 60000, 3600000, "").Slice()
	require.ErrorContains(t, err, "WRONGTYPE")
}
