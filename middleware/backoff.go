package middleware

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Every loop that pauses between tries (the wait for a holder, the retries
// of a completion, a release or an inspection) goes through a backoff; the
// guard's probes and the pacing of poison messages, which keep their count
// across deliveries, take their pauses from the same [Backoff.Pause] and
// jitter.

// backoff is one loop's way through a Backoff.
type backoff struct {
	Backoff
	n int
}

// next returns the loop's next pause, jittered, and moves on.
func (b *backoff) next() time.Duration {
	d := b.Pause(b.n)
	b.n++
	return jitter(d)
}

// wait sleeps for the loop's next pause and reports whether to try again:
// not if the pause would end after limit (the zero time sets none), if wake
// fires first (a nil wake never does), or if ctx is done.
func (b *backoff) wait(ctx context.Context, limit time.Time, wake <-chan struct{}) bool {
	d := b.next()
	if !limit.IsZero() && time.Until(limit) < d {
		return false
	}
	return sleep(ctx, d, wake) == slept
}

// wakeup tells why sleep returned.
type wakeup int

const (
	slept     wakeup = iota // the pause ran out
	woken                   // wake fired
	cancelled               // ctx is done
)

// sleep pauses for d, or until wake fires (a nil wake never does) or ctx
// is done.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) wakeup {
	if ctx.Err() != nil {
		return cancelled
	}
	if d <= 0 {
		return slept
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return slept
	case <-wake:
		return woken
	case <-ctx.Done():
		return cancelled
	}
}

// jitter returns d scaled by a random factor in [0.8, 1.2).
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// retryable reports whether a store error may go away by itself.
func retryable(err error) bool { return err != nil && !backends.IsPermanent(err) }
