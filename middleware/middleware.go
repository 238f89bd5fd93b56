package middleware

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Idempotency is the middleware. Create it with [New] and add its
// [Idempotency.Middleware] method to a router or a handler. It is safe for
// concurrent use and may be shared by several handlers: each gets its own
// key namespace (the handler name) unless Config.Namespace is set.
type Idempotency struct {
	cfg      Config
	guard    *guard
	repeats  *repeats
	logs     logLimit
	handlers topicHandlers
}

// New returns the middleware for cfg, or an error wrapping
// [ErrInvalidConfig] that lists every invalid field. cfg is not modified.
func New(cfg Config) (*Idempotency, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Idempotency{cfg: cfg, guard: newGuard(cfg.MaxConcurrentAcquires, cfg.Timing.StoreBackoff), repeats: newRepeats(cfg.Timing.PoisonBackoff),
		logs: logLimit{logger: cfg.Logger}}, nil
}

// Middleware wraps h so that it runs at most once to completion per key.
// Its signature is message.HandlerMiddleware.
func (m *Idempotency) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return m.handle(msg, h)
	}
}

// delivery carries one message through the state machine.
type delivery struct {
	msg   *message.Message
	ctx   context.Context // msg's context, not cancelled by ack or nack
	key   string
	owner string
	fp    []byte
	ev    Event
}

// handle takes one delivery through the state machine that
// docs/concepts.md draws: key, lease, then run, replay, wait or nack.
func (m *Idempotency) handle(msg *message.Message, h message.HandlerFunc) ([]*message.Message, error) {
	d := &delivery{msg: msg, ctx: context.WithoutCancel(msg.Context()), owner: newOwner()}
	d.ev.MessageUUID, d.ev.Handler = msg.UUID, message.HandlerNameFromCtx(msg.Context())
	m.warnSharedTopic(msg, d.ev.Handler)

	// No usable key: reject, or run unprotected (OnKeyError).
	key, err := m.key(msg, d.ev.Handler)
	if err != nil {
		if m.cfg.OnKeyError == KeyErrorRunUnprotected {
			return m.runUnprotected(d, h, err)
		}
		return m.finish(d, OutcomeKeyError, nil, err)
	}
	d.key, d.ev.Key, d.fp = key, key, m.fingerprint(msg)

	// Take the lease, or learn that the key is completed or in progress.
	res, sentAt, err := m.acquire(d)
	switch {
	case err != nil && msg.Context().Err() != nil: // the router is closing
		return m.finish(d, OutcomeCanceled, nil, err)
	case err != nil && m.cfg.OnStoreError == StoreErrorRunUnprotected:
		return m.runUnprotected(d, h, fmt.Errorf("%w: acquire %q: %w", ErrStore, key, err))
	case err != nil:
		return m.storeError(d, fmt.Errorf("%w: acquire %q: %w", ErrStore, key, err))
	}

	// In progress: wait until the holder completes or gives the key up.
	if res.Status == backends.InProgress && !m.mismatch(d, res) {
		res, sentAt, err = m.waitForHolder(d, res)
		switch {
		case err != nil && msg.Context().Err() != nil:
			return m.finish(d, OutcomeCanceled, nil, err)
		case err != nil:
			return m.storeError(d, err)
		}
	}

	// Another payload under this key: reject, or go on (OnFingerprintMismatch).
	if m.mismatch(d, res) && m.cfg.OnFingerprintMismatch == MismatchReject {
		if res.Status == backends.Acquired {
			m.release(d, nil, res.Lease)
		}
		return m.finish(d, OutcomeFingerprintMismatch, nil, fmt.Errorf("%w: key %q", ErrFingerprintMismatch, key))
	}

	switch res.Status {
	case backends.Acquired: // run the handler under the lease, then complete or release
		return m.run(d, h, res.Lease, sentAt)
	case backends.Completed: // a duplicate: ack, replaying the stored output
		return m.replay(d, res.Output)
	default: // still in progress after the wait: nack, never ack
		return m.finish(d, OutcomeInProgress, nil, &InProgressError{Key: key, Remaining: res.Remaining, Waited: d.ev.Waited})
	}
}
