package redisstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

// raceAfterGet is a hook that runs race once, right after a SET ... GET
// that found a record answers: another process acting on the key between
// Acquire's SET and its compare and set (take.lua).
type raceAfterGet struct{ race func() }

func (h *raceAfterGet) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *raceAfterGet) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.after(cmd)
		}
		return err
	}
}
func (h *raceAfterGet) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.after(cmd)
		return err
	}
}

func (h *raceAfterGet) after(cmd redis.Cmder) {
	if cmd.Err() == nil && cmd.Name() == "set" && slices.Contains(cmd.Args(), any("get")) && h.race != nil {
		race := h.race
		h.race = nil
		race()
	}
}

// An Acquire that reads a released or expired record and loses the key
// to another owner before its compare and set does not take it: the
// record it read is gone, so the script decides again, and answers with
// the winner's live lease. Each fencing token has one holder.
func TestTakeLosesARace(t *testing.T) {
	shared := testserver.RedisClient(t)
	prefix := testserver.Unique("take-test:")
	other := newStorePrefixed(t, shared, prefix)
	hook := &raceAfterGet{}
	s := newStorePrefixed(t, clientWithHook(t, shared.Options().Addr, hook), prefix)
	ctx := context.Background()
	req := func(key, owner string, ttl time.Duration) backends.AcquireRequest {
		return backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: ttl, Retention: time.Hour}
	}
	for name, end := range map[string]func(string, backends.Lease){
		"released": func(_ string, l backends.Lease) { require.NoError(t, other.Release(ctx, l)) },
		"expired":  func(string, backends.Lease) { time.Sleep(30 * time.Millisecond) },
	} {
		t.Run(name, func(t *testing.T) {
			key := testserver.Unique("race")
			first, err := other.Acquire(ctx, req(key, "first", 10*time.Millisecond))
			require.NoError(t, err)
			require.Equal(t, backends.StatusAcquired, first.Status)
			end(key, first.Lease)

			var winner backends.AcquireResult
			hook.race = func() {
				winner, err = other.Acquire(ctx, req(key, "winner", time.Hour))
				require.NoError(t, err)
			}
			res, err := s.Acquire(ctx, req(key, "loser", time.Hour))
			require.NoError(t, err)
			require.Nil(t, hook.race, "the race ran")
			require.Equal(t, backends.StatusAcquired, winner.Status)
			require.EqualValues(t, 2, winner.Lease.Token)
			require.Equal(t, backends.StatusInProgress, res.Status, "the loser sees the winner's lease: %+v", res)
			require.Greater(t, res.Remaining, 50*time.Minute)

			rec, err := s.Inspect(ctx, key)
			require.NoError(t, err)
			require.Equal(t, "winner", rec.Owner)
			require.EqualValues(t, 2, rec.Token)
			require.NoError(t, other.Complete(ctx, winner.Lease, nil), "the winner still holds its lease")
		})
	}
}

// A key someone made persist (PERSIST: no expiry, so no lease end to
// count from) keeps working; its lease's acquisition time becomes
// unknown when the lease is renewed, rather than a time computed from no
// expiry.
func TestPersistedKey(t *testing.T) {
	client := testserver.RedisClient(t)
	prefix := testserver.Unique("persist-test:")
	s := newStorePrefixed(t, client, prefix)
	ctx := context.Background()
	res, err := s.Acquire(ctx, backends.AcquireRequest{Key: "k", Owner: "o", LeaseTTL: time.Minute, Retention: time.Hour})
	require.NoError(t, err)
	require.True(t, client.Persist(ctx, prefix+"k").Val())
	require.NoError(t, s.Renew(ctx, res.Lease, time.Minute))
	require.Equal(t, "p1:o\x001:3600000::\x000:", client.Get(ctx, prefix+"k").Val())
	rec, err := s.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Zero(t, rec.AcquiredAt)
	require.Equal(t, backends.StateInProgress, rec.State)
	require.NoError(t, s.Complete(ctx, res.Lease, []byte("out")))
	again, err := s.Acquire(ctx, backends.AcquireRequest{Key: "k", Owner: "o2", LeaseTTL: time.Minute, Retention: time.Hour})
	require.NoError(t, err)
	require.Equal(t, backends.StatusCompleted, again.Status)
	require.Equal(t, "out", string(again.Output))
}
