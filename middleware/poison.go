package middleware

import (
	"sync"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// A message that fails permanently (no usable key, a fingerprint
// mismatch, an output too large to store: what [IsPoison] recognises)
// fails the same way every time it comes back, and a broker that
// redelivers a nacked message at once (GoChannel, Redis Streams) would
// bring it back as fast as it can. So, as after a store error, the
// delivery pauses before its nack, but only when the same message (by
// UUID) failed so before: its first failure is nacked at once, so that a
// poison queue takes it without delay; the n-th repeat pauses for
// Timing.PoisonBackoff's n-th pause. A message without a poison queue
// then comes back about every PoisonBackoff.Max after its first few
// seconds (Timing.PoisonBackoff documents these numbers).
const (
	// repeatWindow is how long a message's permanent failures are
	// remembered without a new one, in multiples of PoisonBackoff.Max.
	repeatWindow = 10
	// maxRemembered bounds the messages remembered at once.
	maxRemembered = 4096
)

// repeats remembers recent permanent failures by message UUID.
type repeats struct {
	window  time.Duration
	backoff Backoff

	mu   sync.Mutex
	seen map[string]repeat
}

type repeat struct {
	failures int
	last     time.Time
}

func newRepeats(backoff Backoff) *repeats {
	window := backends.MaxDuration
	if backoff.Max < backends.MaxDuration/repeatWindow {
		window = repeatWindow * backoff.Max
	}
	return &repeats{window: window, backoff: backoff, seen: map[string]repeat{}}
}

// failed records a permanent failure of the message uuid and returns the
// pause before its nack: none for its first.
func (r *repeats) failed(uuid string, now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seen) >= maxRemembered {
		r.forgetLocked(now)
	}
	rep := r.seen[uuid]
	if now.Sub(rep.last) > r.window {
		rep.failures = 0
	}
	rep.failures++
	rep.last = now
	r.seen[uuid] = rep
	if rep.failures == 1 {
		return 0
	}
	return jitter(r.backoff.Pause(rep.failures - 2))
}

// forgetLocked drops what is past the window and, if that is not enough,
// half of the rest.
func (r *repeats) forgetLocked(now time.Time) {
	for uuid, rep := range r.seen {
		if now.Sub(rep.last) > r.window {
			delete(r.seen, uuid)
		}
	}
	for uuid := range r.seen {
		if len(r.seen) < maxRemembered/2 {
			break
		}
		delete(r.seen, uuid)
	}
}
