package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	"github.com/watermill-idempotency/idempotency/middleware"
)

func TestPermanentWrapsAndMatches(t *testing.T) {
	require.NoError(t, middleware.Permanent(nil))
	cause := errors.New("bad payload")
	err := middleware.Permanent(cause)
	require.ErrorIs(t, err, middleware.ErrPermanent)
	require.ErrorIs(t, err, cause)
	require.Equal(t, "bad payload", err.Error())
	var pe *middleware.PermanentError
	require.ErrorAs(t, fmt.Errorf("charge: %w", err), &pe)

	for _, tc := range []struct {
		name   string
		err    error
		poison bool
	}{
		{"permanent", err, true},
		{"wrapped permanent", fmt.Errorf("charge: %w", err), true},
		{"plain handler error", cause, false},
		{"nil", nil, false},
		{"permanent after the lease was lost", errors.Join(backends.ErrLeaseLost, err), false},
		{"permanent and in progress", errors.Join(&middleware.InProgressError{Key: "k"}, err), false},
	} {
		require.Equal(t, tc.poison, middleware.IsPoison(tc.err), tc.name)
		require.Equal(t, !tc.poison, middleware.ShouldRetry(wmiddleware.RetryParams{Err: tc.err}), tc.name)
	}
}

// The router recipe of docs/configuration.md: the poison queue outside,
// the middleware, Watermill's Retry inside with ShouldRetry. A handler
// that cannot parse its payload says so with Permanent: it runs once, not
// once per retry; the message lands in the poison topic once and is
// acked; the key is released, not completed, so that a fixed deploy
// processes the message when it is sent again. The control, Retry
// without ShouldRetry, retries it MaxRetries times.
func TestPermanentErrorGoesToThePoisonQueueOnce(t *testing.T) {
	type order struct {
		OrderID string `json:"order_id"`
	}
	for _, tc := range []struct {
		name        string
		shouldRetry func(wmiddleware.RetryParams) bool
		runs        int64
	}{
		{"ShouldRetry", middleware.ShouldRetry, 1},
		{"control: Retry retries everything", nil, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newMemstore()
			m, counters := newMiddleware(t, store, func(c *middleware.Config) { c.Key = keyfunc.Metadata("k") })
			var runs atomic.Int64
			fixed := atomic.Bool{}
			// The retry runs inside the middleware, in the lease.
			retry := wmiddleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond, ShouldRetry: tc.shouldRetry}
			e := newPoisonEnv(t, m, middleware.IsPoison, retry.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				runs.Add(1)
				var o order
				if err := json.Unmarshal(msg.Payload, &o); err != nil && !fixed.Load() {
					return nil, middleware.Permanent(fmt.Errorf("order %s: %w", msg.UUID, err))
				}
				return nil, nil
			}))

			e.publish(t, "in", keyed("m1", "order-1", `{"order_id":123}`)) // a number, not a string
			waitFor(t, "poisoned", func() bool { return len(e.poisoned()) == 1 })
			waitFor(t, "acked", func() bool { return e.wasAcked("m1") })
			require.Equal(t, tc.runs, runs.Load())
			require.Equal(t, []string{"m1"}, e.poisonedUUIDs())
			require.EqualValues(t, 1, counters.Count(middleware.OutcomeHandlerFailedPermanently))
			require.Zero(t, counters.Count(middleware.OutcomeHandlerFailed))

			rec, err := store.Inspect(context.Background(), "test:order-1")
			require.NoError(t, err)
			require.Equal(t, backends.StateReleased, rec.State, "released, not completed")

			fixed.Store(true) // a deploy that reads the order id as a number
			e.publish(t, "in", keyed("m1-again", "order-1", `{"order_id":123}`))
			waitFor(t, "processed after the fix", func() bool { return counters.Count(middleware.OutcomeProcessed) == 1 })
			require.Len(t, e.poisoned(), 1)
		})
	}
}

// Without a poison queue, a permanent handler error is nacked, and a
// broker that redelivers at once (GoChannel) does not spin on it: its
// repeats are paced as every permanent failure's are.
func TestPermanentErrorWithoutPoisonQueueIsPaced(t *testing.T) {
	const watch = 3 * time.Second
	counters := &middleware.Counters{}
	idem, err := middleware.New(middleware.Config{Store: newMemstore(), Key: keyfunc.JSONField("order_id"), Observer: counters})
	require.NoError(t, err)
	var runs atomic.Int64
	newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		r.AddConsumerHandler("charge-order", "orders", ps, func(*message.Message) error {
			runs.Add(1)
			return middleware.Permanent(errors.New("unknown product"))
		}).AddMiddleware(idem.Middleware)
		go func() {
			<-r.Running()
			_ = ps.Publish("orders", newMsg("m1", `{"order_id":"o1"}`))
		}()
	})
	time.Sleep(watch)
	n := runs.Load()
	t.Logf("in %v: the handler ran %d times", watch, n)
	require.GreaterOrEqual(t, n, int64(3), "it still comes back")
	// Runs 1 and 2 at once, then after pauses of 100, 200, 400, 800,
	// 1600 ms (±20 %): at most 7 in 3 s; a nack loop would run it
	// thousands of times.
	require.LessOrEqual(t, n, int64(8), "paced, not spinning")
	require.Equal(t, n, counters.Count(middleware.OutcomeHandlerFailedPermanently))
}
