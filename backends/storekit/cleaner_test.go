package storekit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// A full batch is followed at once by another; a short one waits for the
// interval. Errors go to onError and do not stop the cleaner; its context
// does.
func TestRunCleaner(t *testing.T) {
	var (
		mu      sync.Mutex
		batches []int64
		left    int64 = 23
		errs    []error
	)
	boom := errors.New("boom")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() {
		done <- storekit.RunCleaner(ctx, time.Hour, 10, func(err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}, func(_ context.Context, batch int) (int64, error) {
			mu.Lock()
			defer mu.Unlock()
			if len(batches) == 1 && len(errs) == 0 {
				return 0, boom // the second call fails: the round ends, the cleaner does not
			}
			n := min(left, int64(batch))
			left -= n
			batches = append(batches, n)
			return n, nil
		})
	}()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(batches) == 1 && len(errs) == 1
	}, 10*time.Second, time.Millisecond, "an error ends the round of batches")
	mu.Lock()
	require.Equal(t, []error{boom}, errs)
	mu.Unlock()
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int64{10}, batches, "no batch before the hour-long interval after the failed one")
}

// Back to back while batches are full, then nothing until the interval.
func TestRunCleanerFullBatches(t *testing.T) {
	var mu sync.Mutex
	var batches []int64
	left := int64(25)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() {
		done <- storekit.RunCleaner(ctx, time.Hour, 10, nil, func(context.Context, int) (int64, error) {
			mu.Lock()
			defer mu.Unlock()
			n := min(left, 10)
			left -= n
			batches = append(batches, n)
			return n, nil
		})
	}()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(batches) == 3
	}, 10*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Equal(t, []int64{10, 10, 5}, batches)
}

func TestRunCleanerInvalid(t *testing.T) {
	noop := func(context.Context, int) (int64, error) { return 0, nil }
	require.ErrorIs(t, storekit.RunCleaner(t.Context(), 0, 10, nil, noop), backends.ErrInvalidRequest)
	require.ErrorIs(t, storekit.RunCleaner(t.Context(), time.Second, 0, nil, noop), backends.ErrInvalidRequest)
}
