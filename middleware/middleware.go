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
	return &Idempotency{cfg: cfg, guard: newGuard(cfg.MaxConcurrentAcquires, cfg.Timing.StoreBackoff), repeats: newRepeats(cfg.Timing.PoisonBackoff)}, nil
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

func (m *Idempotency) handle(msg *message.Message, h message.HandlerFunc) ([]*message.Message, error) {
	d := &delivery{msg: msg, ctx: context.WithoutCancel(msg.Context())}
	d.ev.MessageUUID = msg.UUID
	d.ev.Handler = message.HandlerNameFromCtx(msg.Context())
	m.warnSharedTopic(msg, d.ev.Handler)

	key, err := m.key(msg, d.ev.Handler)
	if err != nil {
		if m.cfg.OnKeyError == KeyErrorRunUnprotected {
			d.ev.Err = err
			return m.runUnprotected(d, h)
		}
		return m.finish(d, OutcomeKeyError, nil, err)
	}
	d.key, d.ev.Key = key, key
	d.owner, d.fp = newOwner(), m.fingerprint(msg)

	res, sentAt, err := m.acquire(d)
	if err != nil && d.msg.Context().Err() != nil {
		// Cancelled (the router is closing) while waiting for a slot.
		return m.finish(d, OutcomeInProgress, nil, err)
	}
	if err != nil {
		err = fmt.Errorf("%w: acquire %q: %w", ErrStore, key, err)
		if m.cfg.OnStoreError == StoreErrorRunUnprotected {
			d.ev.Err = err
			return m.runUnprotected(d, h)
		}
		return m.storeError(d, err)
	}
	if res.Status == backends.InProgress && !m.mismatch(d, res) {
		res, sentAt, err = m.waitForHolder(d, res)
		if err != nil && d.msg.Context().Err() != nil {
			// The delivery was cancelled (the router is closing) while the
			// key was still held elsewhere.
			return m.finish(d, OutcomeInProgress, nil, err)
		}
		if err != nil {
			return m.storeError(d, err)
		}
	}
	if m.mismatch(d, res) && m.cfg.OnFingerprintMismatch == MismatchReject {
		if res.Status == backends.Acquired {
			m.release(d, nil, res.Lease)
		}
		return m.finish(d, OutcomeFingerprintMismatch, nil, fmt.Errorf("%w: key %q", ErrFingerprintMismatch, key))
	}

	switch res.Status {
	case backends.Acquired:
		return m.run(d, h, res.Lease, sentAt)
	case backends.Completed:
		out, err := backends.DecodeOutput(res.Output)
		if err != nil {
			return m.storeError(d, fmt.Errorf("key %q: %w", key, err))
		}
		d.ev.Replayed = len(out)
		for _, r := range out {
			for _, k := range m.cfg.ReplayDropMetadata {
				delete(r.Metadata, k)
			}
		}
		return m.finish(d, OutcomeDuplicate, out, nil)
	default:
		return m.finish(d, OutcomeInProgress, nil, &InProgressError{Key: key, Remaining: res.Remaining, Waited: d.ev.Waited})
	}
}
