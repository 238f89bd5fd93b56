package storekit_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// A store's calls go through a Batcher: here at most one batch is in
// flight, so the calls made while it is out go together in the next one.
// send runs a batch and leaves each call's outcome in the call.
func ExampleBatcher() {
	type call struct {
		key    string
		result string
	}
	b := storekit.NewBatcher(1, 64, func(calls []*call) {
		// One round trip for all of calls.
		for _, c := range calls {
			c.result = "done " + c.key
		}
	})
	var wg sync.WaitGroup
	calls := make([]*call, 100)
	for i := range calls {
		calls[i] = &call{key: fmt.Sprint(i)}
		wg.Go(func() {
			if err := b.Do(context.Background(), calls[i]); err != nil {
				panic(err) // only a context that ends while the call waits
			}
		})
	}
	wg.Wait()
	answered := 0
	for _, c := range calls {
		if c.result == "done "+c.key {
			answered++
		}
	}
	fmt.Println(calls[42].result)
	fmt.Println(answered, "calls answered")
	// Output:
	// done 42
	// 100 calls answered
}
