package memstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
)

// The store contract by hand: acquire, see the duplicate, complete.
func Example() {
	ctx := context.Background()
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	req := backends.AcquireRequest{Key: "orders:o-1", Owner: "worker-a", LeaseTTL: 30 * time.Second, Retention: time.Hour}

	res, _ := store.Acquire(ctx, req)
	fmt.Println(res.Status, "token", res.Lease.Token)

	req.Owner = "worker-b"
	dup, _ := store.Acquire(ctx, req)
	fmt.Println(dup.Status)

	_ = store.Complete(ctx, res.Lease, []byte("receipt-17"))
	done, _ := store.Acquire(ctx, req)
	fmt.Println(done.Status, string(done.Output))
	// Output:
	// acquired token 1
	// in_progress
	// completed receipt-17
}

// A fake clock drives lease expiry without sleeping.
func ExampleOptions_now() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store, err := memstore.New(memstore.Options{Now: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()

	first, _ := store.Acquire(ctx, backends.AcquireRequest{Key: "k", Owner: "crashed", LeaseTTL: time.Second, Retention: time.Hour})
	now = now.Add(2 * time.Second) // the holder stopped renewing
	next, _ := store.Acquire(ctx, backends.AcquireRequest{Key: "k", Owner: "next", LeaseTTL: time.Second, Retention: time.Hour})
	fmt.Println(next.Status, "takeover:", next.Lease.Takeover, "token", first.Lease.Token, "->", next.Lease.Token)
	// Output: acquired takeover: true token 1 -> 2
}
