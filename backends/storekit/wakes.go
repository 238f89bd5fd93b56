package storekit

import (
	"context"
	"sync"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Wakes is the registry of a [backends.Watcher]'s watches, by key: the
// store adds a watch when a caller starts watching a key, and wakes the
// key's watches when it learns of a change (its own Complete, Release or
// Delete, or a notification from its server), or every watch when it may
// have missed one (a lost subscription, Close). Each watch is woken at
// most once, and forgotten once woken or stopped.
//
// The zero value is ready to use. It is safe for concurrent use, and
// calls no code of its caller, so a store may call it while it holds a
// lock of its own: holding that lock around the check of a key and Add
// makes sure no change of the key falls between them.
type Wakes struct {
	mu   sync.Mutex
	keys map[string]map[*Watch]struct{}
}

// Watch is one caller's watch of a key, registered in a [Wakes].
type Watch struct {
	wakes   *Wakes
	key     string
	changed chan struct{}
}

// Add registers a watch of key.
func (r *Wakes) Add(key string) *Watch {
	w := &Watch{wakes: r, key: key, changed: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keys == nil {
		r.keys = map[string]map[*Watch]struct{}{}
	}
	ws := r.keys[key]
	if ws == nil {
		ws = map[*Watch]struct{}{}
		r.keys[key] = ws
	}
	ws[w] = struct{}{}
	return w
}

// Wake closes the Changed channel of every watch of key and forgets them.
func (r *Wakes) Wake(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range r.keys[key] {
		close(w.changed)
	}
	delete(r.keys, key)
}

// WakeAll closes the Changed channel of every watch and forgets them.
func (r *Wakes) WakeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ws := range r.keys {
		for w := range ws {
			close(w.changed)
		}
	}
	clear(r.keys)
}

// Changed is closed when the watch is woken; never when it is stopped.
func (w *Watch) Changed() <-chan struct{} { return w.changed }

// Stop forgets the watch without waking it; it does nothing to a watch
// already woken or stopped. It is the stop function a Watcher returns.
func (w *Watch) Stop() { w.end(false) }

// Wake wakes this watch alone and forgets it, unless it was woken or
// stopped already: for a store that finds, once the watch is in place,
// that the key holds no lease to wait for.
func (w *Watch) Wake() { w.end(true) }

func (w *Watch) end(wake bool) {
	r := w.wakes
	r.mu.Lock()
	defer r.mu.Unlock()
	ws := r.keys[w.key]
	if _, ok := ws[w]; !ok {
		return
	}
	if wake {
		close(w.changed)
	}
	delete(ws, w)
	if len(ws) == 0 {
		delete(r.keys, w.key)
	}
}

// WatchOf watches key through store if it is a [backends.Watcher], and
// otherwise reports not ok, as a Watcher that cannot watch does. A store
// that wraps another implements Watch with it, so that it forwards the
// capability whether or not the wrapped store has it.
func WatchOf(ctx context.Context, store backends.Store, key string) (changed <-chan struct{}, stop func(), ok bool) {
	if w, is := store.(backends.Watcher); is {
		return w.Watch(ctx, key)
	}
	return nil, func() {}, false
}
