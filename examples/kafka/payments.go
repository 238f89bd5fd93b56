package main

import (
	"context"
	"errors"
	"sync"
	"time"
)

// slowCharge is how long a payment the demo asks to be slow takes: longer
// than inProgressWait, so that its copy gives up waiting and is nacked
// while it runs, and than rebalanceTimeout with time to spare, so that a
// copy of the service joining the group meanwhile reads its message again
// while it runs.
const slowCharge = 4 * time.Second

// fakePayments stands in for a payment provider, which a real service
// would call here with the order's id as the provider's idempotency key.
// It does what an order's Simulate field asks: "slow" takes slowCharge,
// "flaky" fails the first three calls for the order.
type fakePayments struct {
	mu    sync.Mutex
	calls map[string]int
}

func (p *fakePayments) charge(ctx context.Context, o order) error {
	switch o.Simulate {
	case "slow":
		select {
		case <-time.After(slowCharge):
		case <-ctx.Done(): // the lease was lost, or the service is going down
			return ctx.Err()
		}
	case "flaky":
		p.mu.Lock()
		if p.calls == nil {
			p.calls = map[string]int{}
		}
		p.calls[o.ID]++
		n := p.calls[o.ID]
		p.mu.Unlock()
		if n <= 3 {
			return errors.New("payment provider: timeout")
		}
	}
	return nil
}
