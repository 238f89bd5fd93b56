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
// # Isolation
//
// Every test builds its keys from its own name and a random suffix, and the
// tests run in parallel, so one shared server is enough: no cleanup between
// tests is required.
package storetest
