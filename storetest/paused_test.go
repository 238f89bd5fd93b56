package storetest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/storetest"
)

// The whole suite on the real clock, each test's store pausing after its
// first call of each kind for longer than any lease or retention the suite
// checks is still there: a loaded machine can pause the suite after any
// call. A check the pause leaves unable to tell is tried again; none
// fails.
func TestSuiteOutlastsPauses(t *testing.T) {
	const tick = 20 * time.Millisecond
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		s, err := memstore.New(memstore.Options{})
		require.NoError(t, err)
		return storetest.Fixture{Store: &paused{Store: s, pause: 30 * tick, done: map[string]bool{}}, Tick: tick}
	})
}

// paused is a store whose first call of each kind returns only after a
// pause.
type paused struct {
	backends.Store
	pause time.Duration
	mu    sync.Mutex
	done  map[string]bool
}

func (p *paused) after(call string) {
	p.mu.Lock()
	first := !p.done[call]
	p.done[call] = true
	p.mu.Unlock()
	if first {
		time.Sleep(p.pause)
	}
}

func (p *paused) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	defer p.after("acquire")
	return p.Store.Acquire(ctx, req)
}

func (p *paused) Renew(ctx context.Context, l backends.Lease, ttl time.Duration) error {
	defer p.after("renew")
	return p.Store.Renew(ctx, l, ttl)
}

func (p *paused) Complete(ctx context.Context, l backends.Lease, out []byte) error {
	defer p.after("complete")
	return p.Store.Complete(ctx, l, out)
}

func (p *paused) Release(ctx context.Context, l backends.Lease) error {
	defer p.after("release")
	return p.Store.Release(ctx, l)
}

func (p *paused) Inspect(ctx context.Context, key string) (backends.Record, error) {
	defer p.after("inspect")
	return p.Store.Inspect(ctx, key)
}
