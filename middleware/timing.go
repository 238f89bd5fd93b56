package middleware

import (
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Defaults of [Timing], applied by [New] to its zero fields.
const (
	// DefaultStoreTimeout is the default of Timing.StoreTimeout.
	DefaultStoreTimeout = 5 * time.Second
	// DefaultPollInitial is the default of Timing.Poll.Initial.
	DefaultPollInitial = 50 * time.Millisecond
	// DefaultPollMax is the default of Timing.Poll.Max.
	DefaultPollMax = time.Second
	// DefaultWatchedPollFactor × Poll.Max is the default of
	// Timing.WatchedPoll: 10 s with the default Poll.
	DefaultWatchedPollFactor = 10
	// DefaultStoreBackoffInitial is the default of
	// Timing.StoreBackoff.Initial.
	DefaultStoreBackoffInitial = 10 * time.Millisecond
	// DefaultStoreBackoffMax is the default of Timing.StoreBackoff.Max.
	DefaultStoreBackoffMax = 2 * time.Second
	// DefaultPoisonBackoffInitial is the default of
	// Timing.PoisonBackoff.Initial.
	DefaultPoisonBackoffInitial = 100 * time.Millisecond
	// DefaultPoisonBackoffMax is the default of Timing.PoisonBackoff.Max.
	DefaultPoisonBackoffMax = 2 * time.Second
)

// Timing holds every wait, timeout and pause of the middleware, apart from
// the lease's own rhythm, which follows [Config.LeaseTTL]. [New] fills each
// zero field with its default in its own copy. Every pause is jittered
// (see [Backoff]), so that deliveries that met the same condition at once
// do not all come back at once.
type Timing struct {
	// InProgressWait bounds how long a delivery waits while its key is in
	// progress, that is, held by the live lease of another delivery. If
	// the holder completes, the delivery is acked as a duplicate; if the
	// holder releases the key or its lease runs out, the delivery takes
	// the key and runs; if the key is still in progress when the wait
	// ends, the delivery is nacked with an [*InProgressError]. Negative
	// means do not wait. Defaults to the holder's remaining lease plus
	// Poll.Initial, at most LeaseTTL.
	InProgressWait time.Duration

	// Poll spaces the looks at the store while a delivery waits for the
	// holder of its key: the first pause is Poll.Initial, the next ones
	// double up to Poll.Max. A store that wakes waiters (backends.Watcher:
	// redisstore, pgstore, memstore) is watched instead, and looked at
	// when it wakes the delivery (after the first wake, no sooner than
	// Poll allows), when the holder's lease runs out, and every
	// WatchedPoll. Defaults to 50 ms doubling up to 1 s.
	Poll Backoff

	// WatchedPoll is the pause between two looks at the store while the
	// store watches the key: a safety net for a lost notification, since
	// a wake ends the pause at once. Defaults to
	// DefaultWatchedPollFactor × Poll.Max (10 s).
	WatchedPoll time.Duration

	// StoreTimeout bounds each store call: an Acquire with its retries
	// (not counting the wait for a slot, see Config.MaxConcurrentAcquires),
	// each attempt at a Complete or Release, the Inspect that tells a
	// completion whose reply was lost, and placing a watch. Renewals are
	// bounded by the lease instead. Defaults to 5 s.
	StoreTimeout time.Duration

	// StoreBackoff spaces store calls after failures, so that a failing
	// store sees a trickle of calls, not a storm:
	//   - While the store fails, Acquire calls become probes, one at a time
	//     however many deliveries wait: after the n-th round of failures
	//     (calls in flight together count as one round) the next probe
	//     waits StoreBackoff.Pause(n-1), jittered: 10 ms, 20 ms, 40 ms …
	//     The first success ends it.
	//   - A delivery that failed on the store waits half to all of
	//     StoreBackoff.Max, at random, before its nack, so that a broker
	//     that redelivers a nack at once (GoChannel, AMQP, Redis Streams,
	//     SQL) brings it back at most about once per StoreBackoff.Max/2.
	//   - A failed Complete or Release is retried with these pauses, at
	//     most LeaseTTL/10 each, while the lease is kept, for up to
	//     LeaseTTL (or StoreTimeout if longer) in all.
	// Defaults to 10 ms doubling up to 2 s.
	StoreBackoff Backoff

	// PoisonBackoff spaces the returns of a message that fails for good
	// ([IsPoison]: no usable key, a fingerprint mismatch, an output too
	// large to store, a [Permanent] handler error): its first failure is nacked at once, so that a
	// poison queue takes it without delay; the n-th time the same message
	// (by UUID) fails so again, its nack waits PoisonBackoff.Pause(n-1),
	// jittered: 100 ms, 200 ms, 400 ms …
	// A broker that redelivers a nack at once then brings it back about
	// once per PoisonBackoff.Max, not as fast as it can. A message's
	// failures are remembered for 10 × PoisonBackoff.Max after its last,
	// for up to 4096 messages at once. Defaults to 100 ms doubling up to
	// 2 s.
	PoisonBackoff Backoff
}

// Backoff is a series of pauses, each twice the one before: Initial,
// 2 × Initial, 4 × Initial … up to Max. Each pause is scaled by a random
// factor between 0.8 and 1.2 (±20% jitter). A zero field takes the default
// of the pause it sets; a Max below a default Initial lowers that Initial
// to Max.
type Backoff struct {
	// Initial is the first pause.
	Initial time.Duration
	// Max is the longest pause, at least Initial.
	Max time.Duration
}

// Pause returns the n-th pause (the first is n = 0) before jitter:
// Initial × 2ⁿ, at most Max.
func (b Backoff) Pause(n int) time.Duration {
	d := b.Initial
	for ; n > 0 && d > 0 && d < b.Max; n-- {
		d *= 2
	}
	return min(d, b.Max)
}

// or returns b with its zero fields taken from def.
func (b Backoff) or(def Backoff) Backoff {
	switch {
	case b.Initial == 0 && b.Max == 0:
		return def
	case b.Initial == 0:
		b.Initial = min(def.Initial, b.Max)
	case b.Max == 0:
		b.Max = max(def.Max, b.Initial)
	}
	return b
}

func (t Timing) withDefaults() Timing {
	t.Poll = t.Poll.or(Backoff{DefaultPollInitial, DefaultPollMax})
	if t.WatchedPoll == 0 {
		switch {
		case t.Poll.Max <= 0: // invalid: New reports it
			t.WatchedPoll = DefaultWatchedPollFactor * DefaultPollMax
		case t.Poll.Max > backends.MaxDuration/DefaultWatchedPollFactor:
			t.WatchedPoll = backends.MaxDuration
		default:
			t.WatchedPoll = DefaultWatchedPollFactor * t.Poll.Max
		}
	}
	if t.StoreTimeout == 0 {
		t.StoreTimeout = DefaultStoreTimeout
	}
	t.StoreBackoff = t.StoreBackoff.or(Backoff{DefaultStoreBackoffInitial, DefaultStoreBackoffMax})
	t.PoisonBackoff = t.PoisonBackoff.or(Backoff{DefaultPoisonBackoffInitial, DefaultPoisonBackoffMax})
	return t
}

// validate adds what is wrong with t to errs.
func (t Timing) validate(check func(ok bool, format string, args ...any)) {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"InProgressWait", t.InProgressWait}, {"WatchedPoll", t.WatchedPoll}, {"StoreTimeout", t.StoreTimeout},
	} {
		check(d.v <= backends.MaxDuration, "Timing.%s must be at most %v, got %v", d.name, backends.MaxDuration, d.v)
	}
	check(t.WatchedPoll > 0, "Timing.WatchedPoll must be positive, got %v", t.WatchedPoll)
	check(t.StoreTimeout > 0, "Timing.StoreTimeout must be positive, got %v", t.StoreTimeout)
	t.Poll.validate("Poll", check)
	t.StoreBackoff.validate("StoreBackoff", check)
	t.PoisonBackoff.validate("PoisonBackoff", check)
}

func (b Backoff) validate(name string, check func(ok bool, format string, args ...any)) {
	check(b.Initial > 0, "Timing.%s.Initial must be positive, got %v", name, b.Initial)
	check(b.Max >= b.Initial, "Timing.%s.Max (%v) must be at least Initial (%v)", name, b.Max, b.Initial)
	check(b.Max <= backends.MaxDuration, "Timing.%s.Max must be at most %v, got %v", name, backends.MaxDuration, b.Max)
}
