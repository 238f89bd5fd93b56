package middleware_test

import (
	"testing"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/storetest"
)

// Storms on the in-memory store: eight routers, as eight service instances
// would be, receive three copies of every key at once and share one store.
// Every key's effect is applied exactly once through a fenced sink, and
// no delivery is acked before its key's effect was applied (see
// storetest.Storm.Run). The leases are the default 30 seconds, so the
// promise's condition (no pause longer than the 3-second margin) holds
// even on a loaded machine.

func TestStormMemstore(t *testing.T) {
	store := newMemstore()
	storetest.Storm{
		Instances: 8, Keys: 2000, Copies: 3,
		Store: func(testing.TB, int) backends.Store { return store },
	}.Run(t)
}

// The same with 5% of store calls failing as a network would: half before
// the store sees them, half after it applied them, their replies lost.
// Acquisitions, renewals, completions, releases and inspections are all
// retried, and the promise holds.
func TestStormMemstoreFlakyStore(t *testing.T) {
	store := newMemstore()
	storetest.Storm{
		Instances: 8, Keys: 2000, Copies: 3, Flaky: 0.05,
		Store: func(testing.TB, int) backends.Store { return store },
	}.Run(t)
}
