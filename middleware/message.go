package middleware

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/internal/stack"
)

// Middleware wraps h so that it runs at most once to completion per key.
// Its signature is message.HandlerMiddleware.
func (m *Idempotency) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		// Watermill's router runs each message on a goroutine of its own:
		// its path through the middleware and a network store's client
		// made the stack grow three times per message (runtime.newstack
		// took 12% of the process's CPU in benchmarks/e2ebench, Redis,
		// four consumers). Grown first, it grows once.
		stack.Grow()
		// The delivery stays on the stack; the work, which the lease's
		// context holds, does not.
		w := &messageWork{msg: msg, h: h, drop: m.cfg.ReplayDropMetadata}
		var dv delivery
		d := &dv
		m.initDelivery(d, msg.Context(), w)
		d.paced = true
		d.ev.MessageUUID, d.ev.Handler = msg.UUID, message.HandlerNameFromCtx(msg.Context())
		m.warnSharedTopic(msg, d.ev.Handler)
		key, err := m.key(msg, d.ev.Handler)
		if err == nil {
			d.key, d.fp = key, m.fingerprint(msg)
			d.origin = origin(d.ev.MessageUUID, d.ev.Handler)
		}
		err = m.handle(d, err)
		switch d.ev.Outcome {
		case OutcomeProcessed, OutcomeProcessedNotRecorded, OutcomeDuplicate, OutcomeUnprotected:
			return w.out, err
		}
		return nil, err
	}
}

// messageWork runs a Watermill handler: its output is the messages it
// produces, stored with the completion and replayed to duplicates.
type messageWork struct {
	msg  *message.Message
	h    message.HandlerFunc
	drop []string // Config.ReplayDropMetadata
	out  []*message.Message
}

func (w *messageWork) run(ctx context.Context) ([]byte, error) {
	orig := w.msg.Context()
	w.msg.SetContext(ctx)
	defer w.msg.SetContext(orig)
	out, err := w.h(w.msg)
	w.out = out
	if err != nil {
		return nil, err
	}
	return backends.EncodeOutput(out), nil
}

func (w *messageWork) replay(output []byte) (int, error) {
	out, err := backends.DecodeOutput(output)
	if err != nil {
		return 0, err
	}
	for _, r := range out {
		for _, k := range w.drop {
			delete(r.Metadata, k)
		}
	}
	w.out = out
	return len(out), nil
}

// txOutput is none: a handler that completes its key in its own
// transaction publishes through an outbox (contrib/sqloutbox), or passes
// its messages to the store's CompleteTx itself.
func (w *messageWork) txOutput() ([]byte, error) { return nil, nil }
