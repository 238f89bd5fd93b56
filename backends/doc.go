// Package backends defines the store contract behind the idempotency
// middleware: the [Store] interface, the values it trades in ([Lease],
// [AcquireResult], [Record]) and the sentinel errors every store returns.
//
// Each store lives in its own package below this one (memstore,
// redisstore, pgstore, and the modules mysqlstore and dynamostore) and
// proves itself against the shared conformance suite,
// [github.com/watermill-idempotency/idempotency/storetest], from its tests.
// A third-party store can run the same suite; what the stores share beyond
// the contract (request checks, paging, waking waiters) is in
// backends/storekit, for it to share too.
//
// # The record
//
// A store keeps one record per key. The record is either in progress (a
// processing lease is held by an owner until the lease expires), released
// (free, but kept so its fencing token keeps counting up), or completed
// (the work is done; the record is kept for a retention period together
// with the handler's stored output).
//
// # Rules every store follows
//
//   - Acquire decides on the server, atomically: never read-then-write from
//     the client. Exactly one of any number of concurrent callers for a free
//     key gets [StatusAcquired]. A store whose server cannot take every case in
//     one conditional write (DynamoDB) writes once per case, each write
//     conditioned on that case holding, and tries the next case when the
//     condition fails.
//   - Acquire is re-entrant: the owner that already holds the lease gets the
//     same lease back (same fencing token), with its expiry extended. This is
//     what makes retrying an Acquire after an ambiguous timeout safe.
//   - The fencing token is strictly increasing per key: every acquisition,
//     including the takeover of an expired lease and an acquisition after a
//     release, gets a larger token than any before it, for as long as the
//     record exists.
//   - Renew, Complete and Release act only for the lease's owner with the
//     lease's fencing token, and only while the record is still in progress
//     under that lease; otherwise they return [ErrLeaseLost] and change
//     nothing. A lease whose expiry has passed but that nobody has taken over
//     is still the owner's to renew, complete or release.
//   - Time comes from the store's server (or, for the in-memory store, an
//     injectable clock), never from the caller's wall clock. The one
//     exception is a server with no clock its conditions can read
//     (DynamoDB): its store judges expiry by the callers' clocks, delays
//     every takeover and forgetting by a documented skew margin, and says
//     so.
//   - An expired lease is taken over atomically by the next Acquire, and an
//     expired completed record is gone for good; correctness never depends
//     on a cleanup job having run.
//   - Keys are opaque byte strings: a store must accept any bytes (quotes,
//     spaces, unicode, NUL), up to [MaxKeyBytes], and never splice them
//     into script or query text.
//   - Every store refuses alike, before asking its server, a request
//     beyond the contract's limits ([MaxKeyBytes], [MaxOwnerBytes],
//     [MaxFingerprintBytes], [MaxDuration], [MaxListLimit]), with an error
//     wrapping [ErrInvalidRequest] (package storekit has the checks).
//   - Retention is given once, at Acquire: a completed record is kept for
//     it from the completion, a released or expired one from its lease's
//     end.
//
// # Errors
//
// Besides the sentinels, a store wraps the errors of its server that
// retrying cannot fix (a missing table or permission, a value the server
// cannot hold) in [ErrRejected], so that callers fail at once instead of
// retrying until their timeout ([IsPermanent]). Any other error is taken as
// transient: the middleware retries it with backoff. A store's constructor
// returns an error wrapping [ErrNilClient] or [ErrInvalidOptions], never
// panics.
//
// # Optional capabilities
//
// A store may implement more than [Store]; callers discover it by type
// assertion and do without when it is missing. A store that wraps another
// should forward them.
//
//   - [PoolSizer]: how many calls the store's client can have in flight at
//     once. The middleware keeps half of them free for lease keeping.
//   - [OutputLimiter]: the longest output Complete accepts. The middleware
//     keeps its MaxOutputBytes within it.
//   - [Lister]: paging through and counting a namespace's records, for
//     operators.
//   - [Watcher]: waking waiting duplicates when a key is completed,
//     released or deleted, so that they need not poll. A Watcher wakes
//     every watch it may have failed to notify (a lost subscription).
package backends
