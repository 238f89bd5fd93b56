package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Cleaner is a store with a cleanup job of its own (pgstore, mysqlstore).
type Cleaner interface {
	backends.Store
	Cleanup(ctx context.Context, batch int) (int64, error)
	RunCleaner(ctx context.Context, interval time.Duration, batch int, onError func(error)) error
}

// CheckCleanup checks a store's cleanup: records past their retention
// count as absent before any cleanup, Cleanup deletes them in bounded
// batches, RunCleaner takes full batches back to back, keeps the live
// records and stops with its context, and a batch must be positive.
// count returns the rows in the store's table, forgotten ones included.
//
// A store may keep the row of a record completed before its lease's end
// until that end plus the retention has passed, though the record counts
// as absent from its completion plus the retention: the SQL stores do, so
// that a completion changes no indexed column. The records this check
// has cleaned are checked only once both have passed.
func CheckCleanup(t *testing.T, s Cleaner, count func() int) {
	t.Helper()
	ctx := context.Background()
	// The lease of the records to clean: long enough for the completion
	// to come within it on a loaded machine, and waited out below.
	const lease = 2 * time.Second
	for i := range 25 {
		retention, ttl := time.Hour, time.Minute
		if i < 20 {
			retention, ttl = time.Millisecond, lease
		}
		res, err := s.Acquire(ctx, backends.AcquireRequest{Key: string(rune('a' + i)), Owner: "o", LeaseTTL: ttl, Retention: retention})
		require.NoError(t, err)
		require.NoError(t, s.Complete(ctx, res.Lease, nil))
	}
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, 25, count(), "expired records stay until cleaned, but count as absent")
	_, err := s.Inspect(ctx, "a")
	require.ErrorIs(t, err, backends.ErrNotFound)
	// Every lease began before now, so ends within lease from now; a
	// margin for a server whose clock runs ahead of this one's.
	time.Sleep(lease + 100*time.Millisecond)

	n, err := s.Cleanup(ctx, 8)
	require.NoError(t, err)
	require.EqualValues(t, 8, n, "a bounded batch")
	require.Equal(t, 17, count())

	cctx, cancel := context.WithCancel(ctx)
	stopped := make(chan error)
	go func() { stopped <- s.RunCleaner(cctx, time.Hour, 5, func(err error) { t.Error(err) }) }()
	require.Eventually(t, func() bool { return count() == 5 }, 10*time.Second, 10*time.Millisecond,
		"the cleaner takes full batches back to back and keeps live records")
	cancel()
	require.ErrorIs(t, <-stopped, context.Canceled, "the cleaner stops with its context")

	_, err = s.Cleanup(ctx, 0)
	require.ErrorIs(t, err, backends.ErrInvalidRequest)
	require.ErrorIs(t, s.RunCleaner(ctx, 0, 5, nil), backends.ErrInvalidRequest)
}
