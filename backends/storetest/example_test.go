package storetest_test

import (
	"testing"

	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/backends/storetest"
)

// A store proves itself with one call from its tests. Stores that take time
// from their server leave Advance nil; the suite then sleeps in Ticks.
func ExampleRun() {
	var t *testing.T // the *testing.T of a TestXxx function
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		return storetest.Fixture{Store: memstore.New(memstore.Options{})}
	})
}
