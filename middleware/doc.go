// Package middleware is a Watermill router middleware that runs a handler at
// most once to completion per idempotency key, on any broker, without
// losing messages: at most one live holder per key while no process pauses
// longer than the lease margin (a tenth of [Config.LeaseTTL]), at most one
// applied effect per key with fencing, and no message acked without its
// work done.
//
//	store, err := redisstore.New(client, redisstore.Options{}) // or memstore.New for one process
//	if err != nil {
//		return err
//	}
//	import idempotency "github.com/watermill-idempotency/idempotency/middleware"
//
//	idem, err := idempotency.New(idempotency.Config{
//		Store: store,
//		Key:   keyfunc.JSONField("order_id"),
//	})
//	if err != nil {
//		return err
//	}
//	router.AddMiddleware(idem.Middleware)
//
// # Words
//
//   - Lease: a delivery's claim on a key in the store, for [Config.LeaseTTL]
//     unless renewed. Its fencing token grows with every acquisition of the
//     key.
//   - In progress: the live lease of another delivery holds the key. Only
//     that: a key whose holder's lease ran out is free to take over, and a
//     delivery never finds its own lease in progress.
//   - Completed: the key's work is done and its record kept for
//     [Config.Retention]; later deliveries are duplicates.
//   - Unprotected: the handler ran without a lease, because a policy said so
//     ([KeyErrorRunUnprotected], [StoreErrorRunUnprotected]).
//   - Poison: a message that fails the same way however often it comes
//     back ([IsPoison]).
//
// # What happens to a delivery
//
// The key is extracted ([keyfunc]) and prefixed with the namespace (the
// handler name by default). Then the middleware takes a lease on the key in
// the store:
//
//   - Acquired: the handler runs. The lease is renewed every LeaseTTL/3.
//     On success the key is completed together with the handler's produced
//     messages, and the message is acked. On an error or a panic the lease
//     is released and the message is nacked, so the redelivery runs.
//   - Completed: the work is done. The handler does not run; the stored
//     output is returned (and so published again) and the message is acked.
//   - In progress: this delivery waits (bounded by
//     [Timing.InProgressWait]) and then acks if the holder completed, takes
//     the key if the holder released it or its lease ran out, and otherwise
//     returns an [*InProgressError] so the message is nacked. A delivery
//     whose key is in progress is never acked: if the holder then failed, no
//     copy would be left to retry it.
//
// Every delivery ends in one [Outcome], reported to [Config.Observer].
//
// # Produced messages are never lost
//
// The router publishes a handler's produced messages after the middleware
// returns, and acks after that. If the publish fails, the message is
// nacked and redelivered, and the key is already completed. So the
// middleware stores the produced messages with the completion record (up
// to [Config.MaxOutputBytes]) and returns them again for every delivery of
// a completed key: the side effect runs once, the output is published at
// least once with its original UUIDs. Consumers downstream can deduplicate
// it by UUID with this same middleware.
//
// # Lease keeping and fencing
//
// If a renewal reports the lease lost, or the store cannot be reached
// before the lease would expire, the handler's context is cancelled with a
// cause wrapping backends.ErrLeaseLost and the message is nacked, never
// acked.
// The lease, with its fencing token, is in the handler's context
// ([LeaseFromContext]) so systems the handler writes to can reject writes
// from a stale holder.
//
// # Policies
//
// A policy decides what happens to a delivery the middleware cannot
// protect as usual: [Config.OnKeyError], [Config.OnFingerprintMismatch],
// [Config.OnStoreError]. Each is an enum whose zero value rejects (a typed
// error, so the router nacks the message); the other value is opt-in.
//
// # Waits and pauses
//
// Every wait, timeout and pause is a field of [Timing], with its default;
// each series of pauses is a [Backoff], jittered. The lease's own rhythm
// follows [Config.LeaseTTL].
//
// # Under load
//
// At most [Config.MaxConcurrentAcquires] Acquire calls are in flight at
// once (by default half the pool the store reports); renewals, completions
// and releases never wait for a slot, so the leases of running handlers
// are kept however many duplicates arrive. A failed completion or release
// is retried while the lease is kept. While the store fails, acquisitions
// become probes, one at a time ([Timing.StoreBackoff]), and a delivery that
// failed on the store pauses before its nack, so brokers that redeliver at
// once do not hammer it.
//
// # Errors
//
// Bad input never panics and is never dropped silently: [New] returns an
// error wrapping [ErrInvalidConfig]; a message without a usable key gets a
// [*KeyError]; a payload that differs from the one its key was first seen
// with gets [ErrFingerprintMismatch] when [Config.Fingerprint] is set. A
// handler says that its own error will never succeed with [Permanent]: the
// key is released, and the error is poison too. Route them with Watermill's
// PoisonQueueWithFilter and [IsPoison]; give [ShouldRetry] to Watermill's
// Retry so that it does not retry them. A store that
// cannot be reached nacks the message ([ErrStore]) unless
// [Config.OnStoreError] says to run it unprotected; an error the store
// marks as permanent (backends.ErrRejected) does so at once, without
// retries.
package middleware
