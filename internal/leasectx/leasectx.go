// Package leasectx is what the context of work running under a lease
// carries: the middleware puts it there, and contrib/sqloutbox's WithTx
// marks in it that the work completed its own key in a transaction that
// committed, so that the door does not complete the key again (a store
// call that would fail, and the Inspect that would confirm why).
package leasectx

import (
	"context"
	"sync/atomic"

	"github.com/watermill-idempotency/idempotency/backends"
)

type key struct{}

// Held is the lease work runs under, and what the door keeps of the work.
type Held struct {
	Lease backends.Lease
	// Work is the door's work; the middleware reads it back.
	Work      any
	completed atomic.Bool
}

// With returns ctx carrying h.
func With(ctx context.Context, h *Held) context.Context { return context.WithValue(ctx, key{}, h) }

// From returns what ctx carries, if anything.
func From(ctx context.Context) (*Held, bool) {
	h, ok := ctx.Value(key{}).(*Held)
	return h, ok
}

// MarkCompleted records that the work completed its key with this lease
// in a transaction that has committed. Only a caller that knows the
// commit succeeded may call it: the door then records nothing more, and
// acks.
func (h *Held) MarkCompleted() { h.completed.Store(true) }

// Completed tells whether MarkCompleted was called.
func (h *Held) Completed() bool { return h.completed.Load() }
