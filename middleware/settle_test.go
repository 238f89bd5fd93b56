package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// These tests cover what happens after the handler returns: the completion
// (or, after a failure, the release) is as persistent as the acquisition.

func oneOutput(*message.Message) ([]*message.Message, error) {
	return []*message.Message{newMsg("out", "x")}, nil
}

// requireCompleted fails unless the key is completed in store and a new
// delivery of it is dropped without running the handler.
func requireCompleted(t *testing.T, store backends.Store, m *middleware.Idempotency) {
	t.Helper()
	rec, err := store.Inspect(context.Background(), "test:k")
	require.NoError(t, err)
	require.Equal(t, backends.StateCompleted, rec.State)
	out, err := m.Middleware(func(*message.Message) ([]*message.Message, error) {
		t.Error("the handler ran again")
		return nil, nil
	})(newMsg("k", "x"))
	require.NoError(t, err)
	require.Len(t, out, 1, "the stored output is replayed")
}

// The first completions fail; they are retried and the key ends completed.
func TestCompleteRetriedUntilRecorded(t *testing.T) {
	store := &faultStore{Store: newMemstore(), completeFails: 3}
	m, counters := newMiddleware(t, store, nil)
	out, err := m.Middleware(oneOutput)(newMsg("k", "x"))
	require.NoError(t, err)
	require.Len(t, out, 1)
	require.EqualValues(t, 4, store.completes.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessed))
	requireCompleted(t, store, m)
}

// The store applied the completion but the reply was lost. The retry finds
// the key completed under this very lease: a success.
func TestCompleteReplyLostIsRecognised(t *testing.T) {
	store := &faultStore{Store: newMemstore(), completeLost: 1}
	var events []middleware.Event
	m, _ := newMiddleware(t, store, func(c *middleware.Config) {
		c.Observer = middleware.ObserverFunc(func(_ context.Context, ev middleware.Event) { events = append(events, ev) })
	})
	_, err := m.Middleware(oneOutput)(newMsg("k", "x"))
	require.NoError(t, err)
	require.EqualValues(t, 2, store.completes.Load())
	require.Len(t, events, 1)
	require.Equal(t, middleware.OutcomeProcessed, events[0].Outcome)
	require.False(t, events[0].CompletedByHandler, "this attempt completed it, not the handler")
	requireCompleted(t, store, m)
}

// While the completion is retried, the lease is kept: renewals go on, and
// a duplicate arriving meanwhile finds the key in progress, not free.
func TestLeaseKeptWhileCompletionRetried(t *testing.T) {
	store := &faultStore{Store: newMemstore(), completeErr: errors.New("connection reset")}
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.LeaseTTL = 300 * time.Millisecond // renewed every 100ms
		c.Timing.InProgressWait = -1
	})
	done := make(chan error, 1)
	go func() {
		_, err := m.Middleware(oneOutput)(newMsg("k", "x"))
		done <- err
	}()
	waitFor(t, "three renewals while the completion fails", func() bool { return store.renews.Load() >= 3 })
	_, err := m.Middleware(ok)(newMsg("k", "x"))
	require.ErrorIs(t, err, middleware.ErrInProgress, "the key stayed held while its completion was retried")
	store.set(func(f *faultStore) { f.completeErr = nil })
	require.NoError(t, <-done)
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessed))
	require.Zero(t, counters.Takeovers())
	requireCompleted(t, store, m)
}

// The store becomes unreachable once the handler has finished: completions
// and renewals fail. The middleware keeps trying until the lease cannot be
// kept any longer, and only then acks the work without its completion
// recorded (a nack would run the handler again for certain), logging the
// key at Error level.
func TestCompleteGivesUpOnlyWhenTheLeaseCannotBeKept(t *testing.T) {
	store := &faultStore{Store: newMemstore()}
	logger := watermill.NewCaptureLogger()
	m, counters := newMiddleware(t, store, func(c *middleware.Config) { c.Logger = logger })
	out, err := m.Middleware(func(*message.Message) ([]*message.Message, error) {
		store.set(func(f *faultStore) {
			f.completeErr = errors.New("connection refused")
			f.renewErr = errors.New("connection refused")
		})
		return []*message.Message{newMsg("out", "x")}, nil
	})(newMsg("k", "x"))
	require.NoError(t, err, "acked")
	require.Len(t, out, 1, "its output is published")
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessedNotRecorded))
	require.Greater(t, store.completes.Load(), int64(1), "the completion was retried")
	require.Positive(t, store.renews.Load(), "until the lease could not be renewed")

	var logged bool
	for _, msg := range logger.Captured()[watermill.ErrorLogLevel] {
		if msg.Msg == "idempotency: processed_not_recorded" && msg.Fields["idempotency_key"] == "test:k" {
			logged = true
			require.ErrorIs(t, msg.Err, middleware.ErrStore)
		}
	}
	require.True(t, logged, "logged at Error with the key: %v", logger.Captured())
}

// Completions keep failing while renewals succeed: the retries stop after
// a lease TTL (or StoreTimeout, if longer).
func TestCompleteRetriesAreBounded(t *testing.T) {
	store := &faultStore{Store: newMemstore(), completeErr: errors.New("connection reset")}
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.LeaseTTL = 300 * time.Millisecond
		c.Timing.StoreTimeout = 50 * time.Millisecond
	})
	_, err := m.Middleware(oneOutput)(newMsg("k", "x"))
	require.NoError(t, err)
	require.Greater(t, store.completes.Load(), int64(1))
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessedNotRecorded))
}

// A completion the store refuses for good is not retried.
func TestCompletePermanentErrorNotRetried(t *testing.T) {
	store := &faultStore{Store: newMemstore(),
		completeErr: fmt.Errorf("%w: value too large", backends.ErrRejected)}
	m, counters := newMiddleware(t, store, nil)
	_, err := m.Middleware(oneOutput)(newMsg("k", "x"))
	require.NoError(t, err)
	require.EqualValues(t, 1, store.completes.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessedNotRecorded))
}

// A release that fails after a handler error is retried, so the
// redelivery takes the key at once instead of waiting for the lease to
// run out.
func TestReleaseRetried(t *testing.T) {
	store := &faultStore{Store: newMemstore(), releaseFails: 2}
	m, counters := newMiddleware(t, store, nil)
	_, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, errBoom })(newMsg("k", "x"))
	require.ErrorIs(t, err, errBoom)
	require.EqualValues(t, 3, store.releases.Load())
	rec, err := store.Inspect(context.Background(), "test:k")
	require.NoError(t, err)
	require.Equal(t, backends.StateReleased, rec.State)

	var lease backends.Lease
	_, err = m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		lease, _ = middleware.LeaseFromContext(msg.Context())
		return nil, nil
	})(newMsg("k", "x"))
	require.NoError(t, err)
	require.Equal(t, 2, lease.Attempt)
	require.False(t, lease.Takeover, "taken at once, not after the lease ran out")
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeHandlerFailed))
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessed))
}
