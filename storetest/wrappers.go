package storetest

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// Counted wraps a store and counts every call made through it.
func Counted(s backends.Store, calls *atomic.Int64) backends.Store {
	return &counted{Store: s, calls: calls}
}

type counted struct {
	backends.Store
	calls *atomic.Int64
}

func (c *counted) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	c.calls.Add(1)
	return c.Store.Acquire(ctx, req)
}

func (c *counted) Renew(ctx context.Context, l backends.Lease, ttl time.Duration) error {
	c.calls.Add(1)
	return c.Store.Renew(ctx, l, ttl)
}

func (c *counted) Complete(ctx context.Context, l backends.Lease, out []byte) error {
	c.calls.Add(1)
	return c.Store.Complete(ctx, l, out)
}

func (c *counted) Release(ctx context.Context, l backends.Lease) error {
	c.calls.Add(1)
	return c.Store.Release(ctx, l)
}

func (c *counted) Inspect(ctx context.Context, key string) (backends.Record, error) {
	c.calls.Add(1)
	return c.Store.Inspect(ctx, key)
}

func (c *counted) Delete(ctx context.Context, key string) error {
	c.calls.Add(1)
	return c.Store.Delete(ctx, key)
}

// errFlaky is the transient failure flaky injects.
var errFlaky = errors.New("storetest: injected connection reset")

// flaky fails a fraction of calls the way a network does: half before the
// store sees the call, half after the store applied it (the reply lost).
type flaky struct {
	backends.Store
	rate float64
}

// fault decides the fate of one call: 0 pass, 1 fail before, 2 fail after.
func (f *flaky) fault() int {
	if rand.Float64() >= f.rate {
		return 0
	}
	return 1 + rand.IntN(2)
}

func (f *flaky) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	fault := f.fault()
	if fault == 1 {
		return backends.AcquireResult{}, errFlaky
	}
	res, err := f.Store.Acquire(ctx, req)
	if fault == 2 {
		return backends.AcquireResult{}, errFlaky
	}
	return res, err
}

func (f *flaky) call(fn func() error) error {
	fault := f.fault()
	if fault == 1 {
		return errFlaky
	}
	err := fn()
	if fault == 2 {
		return errFlaky
	}
	return err
}

func (f *flaky) Renew(ctx context.Context, l backends.Lease, ttl time.Duration) error {
	return f.call(func() error { return f.Store.Renew(ctx, l, ttl) })
}

func (f *flaky) Complete(ctx context.Context, l backends.Lease, out []byte) error {
	return f.call(func() error { return f.Store.Complete(ctx, l, out) })
}

func (f *flaky) Release(ctx context.Context, l backends.Lease) error {
	return f.call(func() error { return f.Store.Release(ctx, l) })
}

func (f *flaky) Inspect(ctx context.Context, key string) (backends.Record, error) {
	if f.fault() != 0 {
		return backends.Record{}, errFlaky
	}
	return f.Store.Inspect(ctx, key)
}

// poolSize forwards the wrapped store's backends.PoolSizer, 0 if none.
func poolSize(s backends.Store) int {
	if ps, ok := s.(backends.PoolSizer); ok {
		return ps.PoolSize()
	}
	return 0
}

// PoolSize forwards the wrapped store's pool size.
func (c *counted) PoolSize() int { return poolSize(c.Store) }

// PoolSize forwards the wrapped store's pool size.
func (f *flaky) PoolSize() int { return poolSize(f.Store) }

// outputLimit forwards the wrapped store's backends.OutputLimiter, 0 if
// none.
func outputLimit(s backends.Store) int {
	if ol, ok := s.(backends.OutputLimiter); ok {
		return ol.MaxOutputBytes()
	}
	return 0
}

// MaxOutputBytes forwards the wrapped store's output limit.
func (c *counted) MaxOutputBytes() int { return outputLimit(c.Store) }

// MaxOutputBytes forwards the wrapped store's output limit.
func (f *flaky) MaxOutputBytes() int { return outputLimit(f.Store) }

// Watch forwards the wrapped store's backends.Watcher.
func (c *counted) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	return storekit.WatchOf(ctx, c.Store, key)
}

// Watch forwards the wrapped store's backends.Watcher.
func (f *flaky) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	return storekit.WatchOf(ctx, f.Store, key)
}
