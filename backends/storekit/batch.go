package storekit

import (
	"context"
	"slices"
	"sync"
	"time"
)

// A Batcher groups a store's concurrent calls of type T into batches, one
// round trip each, with no timer (group commit). A call that finds fewer
// than the limit's batches in flight is sent at once, alone, on its
// caller's goroutine: a lone caller waits for nothing. Calls that arrive
// while the limit flies queue, and the first of them, once a batch has
// come back, sends all that queued meanwhile (up to the size) as one
// batch, on its own goroutine; the others sleep until it has. pgstore
// batches its calls into pgx batches with it, mysqlstore its Acquire
// inserts into one statement. It is safe for concurrent use.
type Batcher[T any] struct {
	inFlight, size int
	send           func(batch []T)

	mu     sync.Mutex
	flying int // batches in flight
	queue  []*waiter[T]
}

// waiter is a queued call.
type waiter[T any] struct {
	call T
	// ready receives nil once the call's batch has come back, or the batch
	// this call is to send, which begins with it.
	ready chan []*waiter[T]
}

// NewBatcher returns a batcher that keeps at most inFlight batches (at least 1)
// in flight, each of at most size calls (at least 1). send runs a batch
// and leaves each call's outcome in the call: it is called with one call,
// or with several, and never concurrently for more than inFlight batches.
func NewBatcher[T any](inFlight, size int, send func(batch []T)) *Batcher[T] {
	return &Batcher[T]{inFlight: max(1, inFlight), size: max(1, size), send: send}
}

// Do sends call, alone or in a batch, and returns once its batch has come
// back, or with ctx's error if ctx ends while the call waits in the
// queue: then the call was not sent.
func (b *Batcher[T]) Do(ctx context.Context, call T) error {
	b.mu.Lock()
	if b.flying < b.inFlight {
		b.flying++
		b.mu.Unlock()
		b.lead([]*waiter[T]{{call: call}})
		return nil
	}
	w := &waiter[T]{call: call, ready: make(chan []*waiter[T], 1)}
	b.queue = append(b.queue, w)
	b.mu.Unlock()
	var batch []*waiter[T]
	select {
	case batch = <-w.ready:
	case <-ctx.Done():
		b.mu.Lock()
		if i := slices.Index(b.queue, w); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
			b.mu.Unlock()
			return ctx.Err()
		}
		b.mu.Unlock()
		// Taken already: its batch is on its way, or it is to send one.
		batch = <-w.ready
	}
	if batch != nil {
		b.lead(batch)
	}
	return nil
}

// Queued returns how many calls wait for a batch.
func (b *Batcher[T]) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// lead sends batch, whose first call is the caller's, then hands what
// queued meanwhile to the first of those calls, or gives its slot back.
func (b *Batcher[T]) lead(batch []*waiter[T]) {
	calls := make([]T, len(batch))
	for i, w := range batch {
		calls[i] = w.call
	}
	b.send(calls)
	b.mu.Lock()
	next := b.queue
	if len(next) > b.size {
		b.queue = slices.Clone(next[b.size:])
		next = next[:b.size]
	} else {
		b.queue = nil
	}
	if len(next) == 0 {
		b.flying--
	}
	b.mu.Unlock()
	for _, w := range batch[1:] {
		w.ready <- nil
	}
	if len(next) > 0 {
		next[0].ready <- next
	}
}

// BatchContext returns the context a batch of calls with the contexts
// ctxs is sent with: no call's cancellation ends it, since it carries the others'
// calls too, and it has the latest of their deadlines, or none if one has
// none. Call cancel once the batch has come back.
func BatchContext(ctxs ...context.Context) (ctx context.Context, cancel context.CancelFunc) {
	ctx = context.WithoutCancel(ctxs[0])
	var latest time.Time
	for _, c := range ctxs {
		d, ok := c.Deadline()
		if !ok {
			return ctx, func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(ctx, latest)
}
