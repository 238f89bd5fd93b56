package middleware

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Outcome is what the middleware did with one delivery.
type Outcome int

const (
	// OutcomeProcessed: the lease was acquired, the handler succeeded and
	// the key was completed. The message is acked.
	OutcomeProcessed Outcome = iota + 1
	// OutcomeProcessedNotRecorded: the last resort. The handler succeeded
	// but its completion could not be recorded: the store failed until
	// the lease could no longer be kept, or refused the call for good. The
	// message is still acked (a nack would run the handler again for
	// certain); a duplicate arriving after the lease runs out would run it
	// again. Logged at error level with the key.
	OutcomeProcessedNotRecorded
	// OutcomeHandlerFailed: the handler returned an error or panicked; the
	// lease was released and the message is nacked, so the redelivery runs.
	OutcomeHandlerFailed
	// OutcomeDuplicate: the key was already completed; the handler did not
	// run, the stored output was replayed, and the message is acked.
	OutcomeDuplicate
	// OutcomeInProgress: the key was still in progress when the wait
	// ended (Timing.InProgressWait): the live lease of another delivery
	// held it. The message is nacked with an [*InProgressError], never
	// acked, so that it comes back if the holder fails.
	OutcomeInProgress
	// OutcomeLeaseLost: the lease was lost while the handler ran; the
	// message is nacked and its output dropped.
	OutcomeLeaseLost
	// OutcomeKeyError: no usable key; the message is nacked with a [*KeyError].
	OutcomeKeyError
	// OutcomeFingerprintMismatch: the key's record is for another payload.
	OutcomeFingerprintMismatch
	// OutcomeOutputTooLarge: the handler succeeded but its output was too
	// large to store; the lease was released and the message is nacked.
	OutcomeOutputTooLarge
	// OutcomeStoreError: the store failed before the handler ran; the
	// message is nacked (fail closed), after a pause of half to all of
	// Config.Timing.StoreBackoff.Max.
	OutcomeStoreError
	// OutcomeUnprotected: the handler ran without a lease, because of
	// KeyErrorRunUnprotected or StoreErrorRunUnprotected. Err says why.
	OutcomeUnprotected
	// OutcomeCanceled: the delivery's context was cancelled (the router is
	// closing) before the middleware could take a lease or see the key's
	// holder finish; the handler did not run and the message is nacked.
	OutcomeCanceled
	// OutcomeHandlerFailedPermanently: the handler returned an error made
	// with [Permanent]: the message can never succeed. The lease was
	// released, not completed, so that a fixed deploy can process the key;
	// the message is nacked with that error, which [IsPoison] recognises.
	OutcomeHandlerFailedPermanently

	numOutcomes = iota
)

var outcomeNames = [numOutcomes + 1]string{
	OutcomeProcessed:            "processed",
	OutcomeProcessedNotRecorded: "processed_not_recorded",
	OutcomeHandlerFailed:        "handler_failed",
	OutcomeDuplicate:            "duplicate",
	OutcomeInProgress:           "in_progress",
	OutcomeLeaseLost:            "lease_lost",
	OutcomeKeyError:             "key_error",
	OutcomeFingerprintMismatch:  "fingerprint_mismatch",
	OutcomeOutputTooLarge:       "output_too_large",
	OutcomeStoreError:           "store_error",
	OutcomeUnprotected:          "unprotected",
	OutcomeCanceled:             "canceled",

	OutcomeHandlerFailedPermanently: "handler_failed_permanently",
}

// Outcomes lists every outcome, in order.
func Outcomes() []Outcome {
	out := make([]Outcome, 0, numOutcomes)
	for o := Outcome(1); o <= numOutcomes; o++ {
		out = append(out, o)
	}
	return out
}

// String returns the outcome's snake_case name, fit for a metric label.
func (o Outcome) String() string {
	if o >= 1 && o <= numOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Acked reports whether a delivery with this outcome is acked. It is false
// for OutcomeUnprotected, whose fate is the handler's: see [Event.Acked].
func (o Outcome) Acked() bool {
	switch o {
	case OutcomeProcessed, OutcomeProcessedNotRecorded, OutcomeDuplicate:
		return true
	}
	return false
}

// Event describes one delivery's outcome. Fields that do not apply are zero.
type Event struct {
	// Outcome is what the middleware did with the delivery.
	Outcome Outcome
	// Handler is the name of the router handler the delivery came
	// through, empty outside a router.
	Handler string
	// Key is the full key (empty for OutcomeKeyError).
	Key string
	// MessageUUID is the delivered message's UUID.
	MessageUUID string
	// Lease is the lease the handler ran under, if any. Lease.Takeover
	// tells a takeover of a crashed holder's lease.
	Lease backends.Lease
	// Waited is how long the delivery waited while its key was in
	// progress.
	Waited time.Duration
	// HandlerDuration is how long the handler ran, if it ran.
	HandlerDuration time.Duration
	// Replayed counts the stored messages replayed for OutcomeDuplicate.
	Replayed int
	// FingerprintMismatch is set when the fingerprint differed, whatever
	// the policy made of it.
	FingerprintMismatch bool
	// CompletedByHandler is set for OutcomeProcessed when the handler
	// completed the key itself, in its own transaction.
	CompletedByHandler bool
	// Err is the error returned to the router, or for
	// OutcomeProcessedNotRecorded and OutcomeUnprotected the error behind
	// it (for OutcomeUnprotected joined with HandlerErr).
	Err error
	// HandlerErr is the error the handler returned, if it ran and failed
	// (a panic is an error saying so). It is set for OutcomeHandlerFailed,
	// OutcomeHandlerFailedPermanently,
	// for OutcomeUnprotected when the unprotected handler failed, and for
	// OutcomeLeaseLost when the handler failed after its lease was lost.
	HandlerErr error
}

// Acked reports whether the middleware let the delivery succeed, so that
// the router acks it once it has published the handler's output. It is
// [Outcome.Acked], except that an OutcomeUnprotected delivery is acked
// when its handler succeeded (HandlerErr is nil).
func (e Event) Acked() bool {
	if e.Outcome == OutcomeUnprotected {
		return e.HandlerErr == nil
	}
	return e.Outcome.Acked()
}

// Observer is told about every delivery, synchronously, before the
// middleware returns. Implementations must be safe for concurrent use and
// fast.
type Observer interface {
	Observe(ctx context.Context, ev Event)
}

// ObserverFunc adapts a function to an [Observer].
type ObserverFunc func(ctx context.Context, ev Event)

// Observe calls f(ctx, ev).
func (f ObserverFunc) Observe(ctx context.Context, ev Event) { f(ctx, ev) }

// MultiObserver returns an [Observer] that tells each of observers about
// every delivery, in order. Nil observers are skipped.
func MultiObserver(observers ...Observer) Observer {
	list := make(multiObserver, 0, len(observers))
	for _, o := range observers {
		if o != nil {
			list = append(list, o)
		}
	}
	return list
}

type multiObserver []Observer

func (m multiObserver) Observe(ctx context.Context, ev Event) {
	for _, o := range m {
		o.Observe(ctx, ev)
	}
}

// Counters is an [Observer] that counts outcomes. The zero value is ready.
type Counters struct {
	outcomes  [numOutcomes + 1]atomic.Int64
	takeovers atomic.Int64
	waited    atomic.Int64
}

var _ Observer = (*Counters)(nil)

// Observe implements [Observer].
func (c *Counters) Observe(_ context.Context, ev Event) {
	if ev.Outcome >= 1 && ev.Outcome <= numOutcomes {
		c.outcomes[ev.Outcome].Add(1)
	}
	if ev.Lease.Takeover {
		c.takeovers.Add(1)
	}
	if ev.Waited > 0 {
		c.waited.Add(1)
	}
}

// Count returns how many deliveries had outcome o.
func (c *Counters) Count(o Outcome) int64 {
	if o < 1 || o > numOutcomes {
		return 0
	}
	return c.outcomes[o].Load()
}

// Takeovers returns how many deliveries took over an expired lease.
func (c *Counters) Takeovers() int64 { return c.takeovers.Load() }

// Waited returns how many deliveries waited while their key was in progress.
func (c *Counters) Waited() int64 { return c.waited.Load() }

// Snapshot returns every non-zero outcome count by name.
func (c *Counters) Snapshot() map[string]int64 {
	m := make(map[string]int64)
	for _, o := range Outcomes() {
		if n := c.Count(o); n != 0 {
			m[o.String()] = n
		}
	}
	return m
}
