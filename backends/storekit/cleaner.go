package storekit

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// RunCleaner runs a store's cleanup in batches on a timer, for a store
// whose server does not forget expired records by itself (pgstore and
// mysqlstore run it in their RunCleaner methods).
//
// It calls cleanup(ctx, batch) every interval until ctx is done; a full
// batch (cleanup returns batch) is followed at once by another. It returns
// ctx's error, or an error wrapping backends.ErrInvalidRequest for a
// non-positive interval or batch. Errors from cleanup go to onError
// (which may be nil) and do not stop it.
func RunCleaner(ctx context.Context, interval time.Duration, batch int, onError func(error),
	cleanup func(ctx context.Context, batch int) (int64, error)) error {
	if interval <= 0 || batch <= 0 {
		return fmt.Errorf("%w: interval and batch must be positive", backends.ErrInvalidRequest)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for {
			n, err := cleanup(ctx, batch)
			if err != nil && ctx.Err() == nil && onError != nil {
				onError(err)
			}
			if err != nil || n < int64(batch) {
				break
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
