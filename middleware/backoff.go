package middleware

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// backoffBase is the first pause after a failed store call.
const backoffBase = 10 * time.Millisecond

// jitter returns d scaled by a random factor in [0.8, 1.2).
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// retryable reports whether a store error may go away by itself.
func retryable(err error) bool { return err != nil && !backends.IsPermanent(err) }
