package middleware_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/middleware"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Watermill's Deduplicator, used here as the counter-example and the
		// benchmark baseline, starts a cleanup goroutine that never stops.
		goleak.IgnoreTopFunction("github.com/ThreeDotsLabs/watermill/message/router/middleware.(*mapExpiringKeyRepository).cleanOutLoop"))
}

var errBoom = errors.New("boom")

// faultStore wraps a real store and injects failures where told to.
type faultStore struct {
	backends.Store

	mu            sync.Mutex
	acquireErr    error                            // returned instead of calling Acquire
	ambiguous     int                              // this many Acquires are applied, then reported failed
	renewErr      error                            // renewals hang until their deadline, then fail with it
	completeErr   error                            // returned instead of calling Complete
	completeFails int                              // this many Completes fail without being applied
	completeLost  int                              // this many Completes are applied, then reported failed
	releaseFails  int                              // this many Releases fail without being applied
	holdAcquire   func(key string) <-chan struct{} // if it returns a channel, Acquire waits for it to close

	acquires, renews, completes, releases atomic.Int64
	inAcquire, maxInAcquire               atomic.Int64
}

func (f *faultStore) set(fn func(f *faultStore)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// take decrements *n if it is positive and reports whether it was.
func (f *faultStore) take(n *int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if *n > 0 {
		*n--
		return true
	}
	return false
}

func (f *faultStore) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	f.acquires.Add(1)
	in := f.inAcquire.Add(1)
	defer f.inAcquire.Add(-1)
	for {
		top := f.maxInAcquire.Load()
		if in <= top || f.maxInAcquire.CompareAndSwap(top, in) {
			break
		}
	}
	f.mu.Lock()
	err, hold := f.acquireErr, f.holdAcquire
	f.mu.Unlock()
	if hold != nil {
		if ch := hold(req.Key); ch != nil {
			<-ch
		}
	}
	if err != nil {
		return backends.AcquireResult{}, err
	}
	ambiguous := f.take(&f.ambiguous)
	res, err := f.Store.Acquire(ctx, req)
	if ambiguous && err == nil {
		return backends.AcquireResult{}, errors.New("i/o timeout (the store applied the call)")
	}
	return res, err
}

func (f *faultStore) Renew(ctx context.Context, l backends.Lease, ttl time.Duration) error {
	f.renews.Add(1)
	f.mu.Lock()
	err := f.renewErr
	f.mu.Unlock()
	if err != nil {
		<-ctx.Done() // an unreachable server: the call hangs until its deadline
		return errors.Join(err, ctx.Err())
	}
	return f.Store.Renew(ctx, l, ttl)
}

func (f *faultStore) Complete(ctx context.Context, l backends.Lease, out []byte) error {
	f.completes.Add(1)
	f.mu.Lock()
	err := f.completeErr
	f.mu.Unlock()
	switch {
	case err != nil:
		return err
	case f.take(&f.completeFails):
		return errors.New("connection reset (not applied)")
	case f.take(&f.completeLost):
		if err := f.Store.Complete(ctx, l, out); err != nil {
			return err
		}
		return errors.New("i/o timeout (the store applied the call)")
	}
	return f.Store.Complete(ctx, l, out)
}

func (f *faultStore) Release(ctx context.Context, l backends.Lease) error {
	f.releases.Add(1)
	if f.take(&f.releaseFails) {
		return errors.New("connection reset (not applied)")
	}
	return f.Store.Release(ctx, l)
}

// newMiddleware returns the middleware over store with test-friendly
// defaults; fn adjusts the config.
func newMiddleware(t *testing.T, store backends.Store, fn func(c *middleware.Config)) (*middleware.Idempotency, *middleware.Counters) {
	t.Helper()
	counters := &middleware.Counters{}
	cfg := middleware.Config{
		Store:     store,
		Namespace: "test",
		LeaseTTL:  time.Second,
		Timing: middleware.Timing{
			Poll: middleware.Backoff{Initial: 5 * time.Millisecond},
			// Short, so that tests of store failures and of poison messages
			// do not wait long before their nack; guard_test.go and
			// hotloop_test.go check the pauses themselves.
			StoreBackoff:  middleware.Backoff{Max: 100 * time.Millisecond},
			PoisonBackoff: middleware.Backoff{Max: 100 * time.Millisecond},
		},
		Observer: counters,
	}
	if fn != nil {
		fn(&cfg)
	}
	m, err := middleware.New(cfg)
	require.NoError(t, err)
	return m, counters
}

// routerEnv is a running router on a GoChannel.
type routerEnv struct {
	pubSub *gochannel.GoChannel
	router *message.Router
}

// newRouter starts a router on a fresh GoChannel after setup has added its
// handlers, and stops both when the test ends.
func newRouter(t *testing.T, setup func(r *message.Router, ps *gochannel.GoChannel)) *routerEnv {
	t.Helper()
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, logger)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	require.NoError(t, err)
	setup(r, ps)
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, ps.Close())
	})
	return &routerEnv{pubSub: ps, router: r}
}

func (e *routerEnv) publish(t *testing.T, topic string, msgs ...*message.Message) {
	t.Helper()
	require.NoError(t, e.pubSub.Publish(topic, msgs...))
}

// collect subscribes to topic and returns a function listing what arrived.
func (e *routerEnv) collect(t *testing.T, topic string) func() []*message.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := e.pubSub.Subscribe(ctx, topic)
	require.NoError(t, err)
	var mu sync.Mutex
	var got []*message.Message
	go func() {
		for m := range ch {
			mu.Lock()
			got = append(got, m)
			mu.Unlock()
			m.Ack()
		}
	}()
	return func() []*message.Message {
		mu.Lock()
		defer mu.Unlock()
		return append([]*message.Message(nil), got...)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, 2*time.Millisecond, what)
}

// total counts every outcome the counters saw.
func total(c *middleware.Counters) int64 {
	var n int64
	for _, o := range middleware.Outcomes() {
		n += c.Count(o)
	}
	return n
}

func newMsg(uuid, payload string) *message.Message {
	return message.NewMessage(uuid, []byte(payload))
}

// newMemstore is memstore.New with the zero options, which it never
// refuses.
func newMemstore() *memstore.Store {
	s, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	return s
}
