// Package storetest is the conformance suite for [backends.Store]
// implementations. Every store in this module runs it, and a third-party
// store can run it with one call:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Fixture {
//			return storetest.Fixture{Store: newMyStore(t)}
//		})
//	}
//
// # Time
//
// Stores that take time from their server (Redis, Postgres) cannot be
// given a fake clock, so the suite works in multiples of [Fixture.Tick]
// with real, short lease TTLs and real sleeps. A store with an injectable
// clock sets [Fixture.Advance] and the suite moves the clock instead of
// sleeping. A store that judges time by its callers' clocks with a skew
// margin sets [Fixture.Skew]: the suite then waits that much longer
// before it expects a lease expired or a record forgotten.
//
// A sleep only ever runs late, and a loaded machine can pause the suite
// anywhere, so the suite counts on no call being quick: it expects a lease
// or a record gone only after waiting at least its time, and checks that
// one is still there only when it measured that less than its time can
// have passed since the call that started it; a check a pause left unable
// to tell is made again, on a new key, up to five times.
//
// # Isolation
//
// Every test builds its keys from its own name and a random suffix, and the
// tests run in parallel, so one shared server is enough: no cleanup between
// tests is required.
//
// # Storms and races
//
// The conformance suite checks one call at a time and small races. The
// promise itself is measured under load by [Storm]: several Watermill
// routers, each with its own store as separate service instances have,
// receive copies of the same keys at once and apply each key's effect
// through a fenced [Sink], which refuses a fencing token below the highest
// it applied for the key. [Storm.Run] fails the test unless every key's
// effect was applied exactly once and no delivery was acked before its
// key's effect. [Race] races many clients for a few keys through the store
// alone, with takeovers of abandoned leases.
//
//	func TestStorm(t *testing.T) {
//		storetest.Storm{
//			Instances: 8, Keys: 2000, Copies: 3,
//			Store: func(t testing.TB, i int) backends.Store { return newMyStore(t) },
//		}.Run(t)
//	}
//
// A SQL store that completes a key in the caller's transaction runs
// [TxStorm], whose handlers write a fenced business [Table] and complete the
// key in one transaction. [CheckCleanup] checks a store's cleanup job, and
// [CheckRejected] what a store and the middleware do when the store's
// server refuses a call (its table missing).
//
// # Where it sits
//
// The suite drives a store through the middleware, [idempotency.Do] and
// httpidem, so it sits above them: a store imports it from its tests only,
// never from its own code, and nothing below the middleware imports it.
package storetest
