// Package storekit is for store authors and for the library's own
// constructors: what the stores of this repository share beyond the
// contract in package backends, for a third-party store to share too, and
// the checks the middleware and the contrib modules (idemotel, awssqs,
// sqloutbox) make of the clients and stores they are given ([IsNil]). An
// application that uses the middleware does not import it.
//
// # Checking requests
//
// Every store refuses alike, before it asks its server, a request beyond
// the contract's limits: [ValidateAcquire], [ValidateLease], [ValidateKey],
// [ValidateLeaseTTL], [ValidateRetention] and [ValidateList] return the
// errors wrapping backends.ErrInvalidRequest that the conformance suite
// expects.
//
// # Listing
//
// The stores page by key: a page's cursor is its last key ([ListCursor],
// [ParseListCursor]), and a namespace is a key prefix ([ListPrefix]) or,
// for a server that keeps keys in order, a key range ([ListRange]). A
// store whose server cannot read keys in order scans them and lets [Page]
// sort them and fill the page; [AddCount] counts records one by one.
//
// # Waking waiters
//
// A [backends.Watcher] keeps its watches in a [Wakes] and wakes them by
// key; [WatchOf] forwards the capability from a store that wraps another.
//
// # Batching calls
//
// A store whose server charges mostly per round trip or per statement
// sends the calls that meet in one: a [Batcher] keeps a number of them in
// flight and sends those that queue meanwhile together, and
// [BatchContext] is the context such a batch runs with.
//
// # Lifecycle
//
// [IsNil] tells a constructor it was given a typed nil client (a store's
// constructor) or store (a constructor that uses or wraps one), and
// [RunCleaner] runs a cleanup in batches on a timer, for a store whose
// server does not forget expired records by itself.
//
// A store runs [github.com/watermill-idempotency/idempotency/storetest]
// against itself, from its tests, to prove that it keeps the contract.
package storekit
