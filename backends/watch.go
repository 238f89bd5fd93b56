package backends

import "context"

// Watcher is an optional capability of a [Store]: waking the callers that
// wait for a key another owner holds as soon as the key is completed,
// released or deleted, instead of leaving them to poll. The middleware
// watches a key while a duplicate waits for it, and asks the store again
// only when woken, when the holder's lease runs out, and, as a safety
// net, at a slow pace. memstore, redisstore and pgstore implement it;
// storetest checks it for every store that does.
type Watcher interface {
	// Watch starts watching key and returns once the watch is in place: a
	// completion, release or deletion of key after Watch returns closes
	// changed. If key holds no live lease in progress once the watch is in
	// place (it has no record, or it was completed, released or deleted,
	// or its lease ran out before), changed is closed by the time Watch
	// returns: the caller need not ask the store again to cover the time
	// before the watch was in place. changed may also be closed without a
	// change, and must be whenever the store may have missed one (a
	// subscription lost, a connection closed): the caller then asks the
	// store again and watches anew. ok is false when the store cannot
	// watch now (no subscription, or ctx done first): the caller then
	// polls as it would without a Watcher, and changed is nil. stop ends
	// the watch and is never nil; call it once the wait is over.
	Watch(ctx context.Context, key string) (changed <-chan struct{}, stop func(), ok bool)
}
