package middleware

import (
	"sync"
	"time"
)

// A message that fails permanently (no usable key, a fingerprint
// mismatch, an output too large to store: what [IsPoison] recognises)
// fails the same way every time it comes back, and a broker that
// redelivers a nacked message at once (GoChannel, Redis Streams) would
// bring it back as fast as it can. So, as after a store error, the
// delivery pauses before its nack, but only when the same message (by
// UUID) failed so before: its first failure is nacked at once, so that a
// poison queue takes it without delay; the n-th repeat pauses
// repeatPauseBase·2ⁿ⁻¹, jittered, at most Config.MaxStoreBackoff. A
// message without a poison queue then comes back about every
// MaxStoreBackoff after its first few seconds.
const (
	repeatPauseBase = 100 * time.Millisecond
	// repeatWindow is how long a message's permanent failures are
	// remembered without a new one, in multiples of MaxStoreBackoff.
	repeatWindow = 10
	// maxRemembered bounds the messages remembered at once.
	maxRemembered = 4096
)

// repeats remembers recent permanent failures by message UUID.
type repeats struct {
	window time.Duration
	max    time.Duration

	mu   sync.Mutex
	seen map[string]repeat
}

type repeat struct {
	failures int
	last     time.Time
}

func newRepeats(maxPause time.Duration) *repeats {
	return &repeats{window: repeatWindow * maxPause, max: maxPause, seen: map[string]repeat{}}
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
	return jitter(min(repeatPauseBase<<min(rep.failures-2, 20), r.max))
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
