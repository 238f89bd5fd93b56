package storetest_test

import (
	"testing"

	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/storetest"
)

// A store proves itself with one call from its tests. Stores that take time
// from their server leave Advance nil; the suite then sleeps in Ticks.
func ExampleRun() {
	var t *testing.T // the *testing.T of a TestXxx function
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		store, err := memstore.New(memstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return storetest.Fixture{Store: store}
	})
}
