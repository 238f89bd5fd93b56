package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// privateStore is a store on a Redis of its own, whose pub/sub clients a
// test may kill, and an admin client to that Redis.
func privateStore(t *testing.T) (*redis.Client, backends.Store) {
	t.Helper()
	r := testserver.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	return client, newStore(t, client)
}

// killSubscriptions closes the connections of the server's pub/sub
// clients, as a failover or a network fault would, once there is one.
func killSubscriptions(t *testing.T, admin *redis.Client) {
	t.Helper()
	require.Eventually(t, func() bool {
		n, err := admin.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Result()
		require.NoError(t, err)
		return n > 0
	}, 30*time.Second, 10*time.Millisecond, "no pub/sub connection to kill")
}

const wakeWait = 30 * time.Second

// A lost subscription wakes the watches it served (they may have missed a
// change); Watch reports not ok until a new subscription is confirmed,
// and a watch then works again.
func TestWatchWokenWhenSubscriptionLost(t *testing.T) {
	admin, store := privateStore(t)
	w := store.(backends.Watcher)
	ctx := context.Background()
	res, err := store.Acquire(ctx, backends.AcquireRequest{Key: "k", Owner: "holder", LeaseTTL: time.Hour, Retention: time.Hour})
	require.NoError(t, err)

	changed, stop, ok := w.Watch(ctx, "k")
	require.True(t, ok)
	killSubscriptions(t, admin)
	select {
	case <-changed:
	case <-time.After(wakeWait):
		t.Fatalf("the watch was not woken within %v of losing its subscription", wakeWait)
	}
	stop()

	require.Eventually(t, func() bool {
		changed, stop, ok = w.Watch(ctx, "k")
		return ok
	}, wakeWait, 20*time.Millisecond, "no new subscription after the loss")
	defer stop()
	require.NoError(t, store.Complete(ctx, res.Lease, nil))
	select {
	case <-changed:
	case <-time.After(wakeWait):
		t.Fatalf("the new watch was not woken within %v of the completion", wakeWait)
	}
}

// subscribed reports whether a client of the server is subscribed to a
// sharded channel.
func subscribed(t *testing.T, admin *redis.Client) bool {
	list, err := admin.ClientList(context.Background()).Result()
	require.NoError(t, err)
	for _, line := range strings.Split(list, "\n") {
		for _, f := range strings.Fields(line) {
			if n, ok := strings.CutPrefix(f, "ssub="); ok && n != "0" {
				return true
			}
		}
	}
	return false
}

// The subscription of a waiting duplicate is killed mid-wait, and the
// holder completes while the store cannot watch: the duplicate falls back
// to polling, finds the completion and is acked as a duplicate.
func TestDuplicateAckedWhenSubscriptionLostMidWait(t *testing.T) {
	admin, store := privateStore(t)
	ctx := context.Background()
	var counters idempotency.Counters
	idem, err := idempotency.New(idempotency.Config{
		Store: store, Namespace: "w", LeaseTTL: 10 * time.Minute, Timing: idempotency.Timing{
			InProgressWait: 5 * time.Minute, Poll: idempotency.Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond},
		},
		Observer: &counters,
	})
	require.NoError(t, err)
	holder, err := store.Acquire(ctx, backends.AcquireRequest{Key: "w:k", Owner: "holder", LeaseTTL: time.Hour, Retention: time.Hour})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := idem.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("k", nil))
		done <- err
	}()
	require.Eventually(t, func() bool { return subscribed(t, admin) }, wakeWait, 10*time.Millisecond,
		"the waiting duplicate never watched its key")
	killSubscriptions(t, admin)
	require.NoError(t, store.Complete(ctx, holder.Lease, nil))
	select {
	case err := <-done:
		require.NoError(t, err, "the duplicate is acked")
	case <-time.After(2 * wakeWait):
		t.Fatal("the duplicate was not acked after its subscription was lost")
	}
	require.EqualValues(t, 1, counters.Count(idempotency.OutcomeDuplicate))
}
