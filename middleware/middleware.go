package middleware

import (
	"context"
	"fmt"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Idempotency is the middleware. Create it with [New] and add its
// [Idempotency.Middleware] method to a router or a handler; run any
// function through it with [Do], and HTTP requests with package httpidem.
// It is safe for concurrent use and may be shared by several handlers:
// each gets its own key namespace (the handler name) unless
// Config.Namespace is set.
type Idempotency struct {
	cfg      Config
	guard    *guard
	repeats  *repeats
	logs     logLimit
	handlers topicHandlers
	cache    *completedCache // nil when Config.CompletedCache is off
}

// New returns the middleware for cfg, or an error wrapping
// [ErrInvalidConfig] that lists every invalid field. cfg is not modified.
func New(cfg Config) (*Idempotency, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Idempotency{cfg: cfg, guard: newGuard(cfg.MaxConcurrentAcquires, cfg.Timing.StoreBackoff), repeats: newRepeats(cfg.Timing.PoisonBackoff),
		logs: logLimit{logger: cfg.Logger}, cache: newCompletedCache(cfg.CompletedCache)}, nil
}

// Config returns the configuration in effect: the one given to [New],
// with the defaults it filled in.
func (m *Idempotency) Config() Config { return m.cfg }

// delivery carries one call through the state machine: a message through
// the Watermill middleware, a function through [Do], a request through
// package httpidem. Each of those doors fills it and reads its work's
// result after [Idempotency.handle].
type delivery struct {
	ctx    context.Context // the caller's: done when the caller gives up (the router closes, the client leaves)
	base   context.Context // ctx without its cancellation, for the calls that settle the key
	w      work
	key    string // the full key, namespace included
	owner  string
	fp     []byte
	recFP  []byte // the record's fingerprint, as the lease's Acquire reported it
	origin string // for the store's record (AcquireRequest.Origin)
	ev     Event

	// What differs by door.
	noWait   bool           // a key in progress is reported at once, not waited for
	mismatch MismatchPolicy // what a fingerprint mismatch does
	paced    bool           // store errors and repeated poison pause before returning (a broker redelivers at once)
}

// work is what a door runs under a lease, and how it stores and replays
// its result.
type work interface {
	// run does the work, with the lease in ctx, and returns what to store
	// with the key's completion for duplicates to replay.
	run(ctx context.Context) (output []byte, err error)
	// replay hands a duplicate the output stored with the completion, and
	// returns the number of messages it replays (for Event.Replayed).
	replay(output []byte) (int, error)
	// txOutput is the output to record when the work completes its key in
	// a transaction of its own: see [CompletionOutput].
	txOutput() ([]byte, error)
}

// initDelivery readies d for work w of a caller with ctx.
func (m *Idempotency) initDelivery(d *delivery, ctx context.Context, w work) {
	d.ctx, d.base, d.w, d.owner, d.mismatch = ctx, context.WithoutCancel(ctx), w, newOwner(), m.cfg.OnFingerprintMismatch
}

// handle takes one delivery through the state machine that
// docs/concepts.md draws: lease, then run, replay, wait or refuse. d.key is
// set, or keyErr says why there is no usable key. It returns the error for
// the caller; the outcome is in d.ev.
func (m *Idempotency) handle(d *delivery, keyErr error) error {
	// No usable key: reject, or run unprotected (OnKeyError).
	if keyErr != nil {
		if m.cfg.OnKeyError == KeyErrorRunUnprotected {
			return m.runUnprotected(d, keyErr)
		}
		return m.finish(d, OutcomeKeyError, keyErr)
	}
	d.ev.Key = d.key

	// Take the lease, or learn that the key is completed or in progress.
	res, sentAt, err := m.acquire(d)
	switch {
	case err != nil && d.ctx.Err() != nil: // the caller is gone
		return m.finish(d, OutcomeCanceled, err)
	case err != nil && m.cfg.OnStoreError == StoreErrorRunUnprotected:
		return m.runUnprotected(d, fmt.Errorf("%w: acquire %q: %w", ErrStore, d.key, err))
	case err != nil:
		return m.storeError(d, fmt.Errorf("%w: acquire %q: %w", ErrStore, d.key, err))
	}

	// In progress: wait until the holder completes or gives the key up.
	if res.Status == backends.StatusInProgress && !d.noWait && !m.mismatched(d, res) {
		res, sentAt, err = m.waitForHolder(d, res)
		switch {
		case err != nil && d.ctx.Err() != nil:
			return m.finish(d, OutcomeCanceled, err)
		case err != nil:
			return m.storeError(d, err)
		}
	}

	// Another payload under this key: reject, or go on (OnFingerprintMismatch).
	if m.mismatched(d, res) && d.mismatch == MismatchReject {
		if res.Status == backends.StatusAcquired {
			m.release(d, nil, res.Lease)
		}
		return m.finish(d, OutcomeFingerprintMismatch, fmt.Errorf("%w: key %q", ErrFingerprintMismatch, d.key))
	}

	switch res.Status {
	case backends.StatusAcquired:
		d.recFP = res.Fingerprint
		return m.run(d, res.Lease, sentAt)
	case backends.StatusCompleted:
		return m.replay(d, res.Output)
	default: // still in progress after the wait: refuse, never succeed
		return m.finish(d, OutcomeInProgress, &InProgressError{Key: d.key, Remaining: res.Remaining, Waited: d.ev.Waited})
	}
}
