package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	"github.com/watermill-idempotency/idempotency/storetest"
)

const wait = time.Minute // generous: these machines are small and shared

// The full suite with every call sent on its own.
func TestConformanceCoalesceOff(t *testing.T) {
	client := testserver.RedisClient(t)
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		return storetest.Fixture{Store: storeWith(t, client, redisstore.Options{Coalescing: redisstore.CoalesceOff})}
	})
}

func storeWith(t *testing.T, client redis.UniversalClient, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = testserver.Unique("coalesce-test:")
	}
	s, err := redisstore.New(client, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// pipes is a go-redis hook that watches the store's round trips. A
// command on a key holding "hold" waits, before it is sent, until held is
// closed; while pipeHeld is open, every pipeline of scripts waits for it,
// after reporting its keys on piped.
type pipes struct {
	holding  chan struct{} // a command on a "hold" key is waiting
	held     chan struct{}
	pipeHeld chan struct{}
	piped    chan []string
	fail     atomic.Pointer[error] // the error every pipeline of the store's calls fails with

	batched      atomic.Int64 // pipelines of more than one command
	batchedCmds  atomic.Int64 // commands in them
	noScript     atomic.Int64 // commands answered NOSCRIPT
	pipeNoScript atomic.Int64 // commands answered NOSCRIPT in a pipeline
	evals        atomic.Int64 // commands sent with EVAL in a pipeline
}

func newPipes() *pipes { return &pipes{holding: make(chan struct{}, 1), held: make(chan struct{})} }

// keyOf is the key of one of the store's commands: a script's first key,
// or a plain command's first argument.
func keyOf(cmd redis.Cmder) string {
	args := cmd.Args()
	i := 1
	if n := cmd.Name(); n == "evalsha" || n == "eval" {
		i = 3
	}
	if len(args) > i {
		s, _ := args[i].(string)
		return s
	}
	return ""
}

// storeCalls says whether cmds are the store's calls: scripts, and the
// SET of Acquire's fast path.
func storeCalls(cmds []redis.Cmder) bool {
	for _, cmd := range cmds {
		if n := cmd.Name(); n != "evalsha" && n != "eval" && n != "set" {
			return false
		}
	}
	return true
}

func (h *pipes) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *pipes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.Contains(keyOf(cmd), "hold") {
			select {
			case h.holding <- struct{}{}:
			default:
			}
			<-h.held
		}
		err := next(ctx, cmd)
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			h.noScript.Add(1)
		}
		return err
	}
}

func (h *pipes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !storeCalls(cmds) { // such as the commands go-redis sends on a new connection
			return next(ctx, cmds)
		}
		if len(cmds) > 1 {
			h.batched.Add(1)
			h.batchedCmds.Add(int64(len(cmds)))
		}
		for _, cmd := range cmds {
			if cmd.Name() == "eval" {
				h.evals.Add(1)
			}
		}
		if err := h.fail.Load(); err != nil {
			return *err // as a connection lost before the replies would
		}
		if h.pipeHeld != nil {
			keys := make([]string, len(cmds))
			for i, cmd := range cmds {
				keys[i] = keyOf(cmd)
			}
			h.piped <- keys
			<-h.pipeHeld
		}
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
				h.noScript.Add(1)
				h.pipeNoScript.Add(1)
			}
		}
		return err
	}
}

// hammer runs rounds of 64 workers on one store. In each round every
// worker tries to acquire each of 8 shared keys; exactly one wins each
// key, with a token one above the last round's, and the winners release
// their keys when the round is over. Each worker also acquires,
// completes and asks again for a key of its own.
func hammer(t *testing.T, s backends.Store, rounds int) {
	const workers, shared = 64, 8
	ctx := context.Background()
	for round := range rounds {
		var (
			mu   sync.Mutex
			wins = make([][]backends.Lease, shared)
			wg   sync.WaitGroup
		)
		for w := range workers {
			wg.Go(func() {
				owner := fmt.Sprintf("w%d-r%d", w, round)
				for i := range shared {
					k := (i + w) % shared
					res, err := s.Acquire(ctx, backends.AcquireRequest{
						Key: fmt.Sprintf("shared-%d", k), Owner: owner, LeaseTTL: time.Minute, Retention: time.Minute})
					if !assert.NoError(t, err) {
						return
					}
					switch res.Status {
					case backends.StatusAcquired:
						assert.False(t, res.Reentrant, "%+v", res)
						mu.Lock()
						wins[k] = append(wins[k], res.Lease)
						mu.Unlock()
					case backends.StatusInProgress:
					default:
						t.Errorf("shared key %d, round %d: %+v", k, round, res)
					}
				}
				own := fmt.Sprintf("own-%d-%d", w, round)
				res, err := s.Acquire(ctx, backends.AcquireRequest{Key: own, Owner: owner, LeaseTTL: time.Minute, Retention: time.Minute})
				if !assert.NoError(t, err) || !assert.Equal(t, backends.StatusAcquired, res.Status) {
					return
				}
				assert.EqualValues(t, 1, res.Lease.Token)
				assert.Equal(t, 1, res.Lease.Attempt)
				if !assert.NoError(t, s.Complete(ctx, res.Lease, []byte(own))) {
					return
				}
				dup, err := s.Acquire(ctx, backends.AcquireRequest{Key: own, Owner: owner + "-dup", LeaseTTL: time.Minute, Retention: time.Minute})
				if assert.NoError(t, err) && assert.Equal(t, backends.StatusCompleted, dup.Status) {
					assert.Equal(t, own, string(dup.Output))
				}
			})
		}
		wg.Wait()
		for k, won := range wins {
			require.Len(t, won, 1, "shared key %d, round %d: acquired exactly once", k, round)
			l := won[0]
			require.EqualValues(t, round+1, l.Token, "shared key %d: one token up per round", k)
			require.False(t, l.Takeover, "%+v", l)
			wg.Go(func() { assert.NoError(t, s.Release(ctx, l)) })
		}
		wg.Wait()
		require.False(t, t.Failed())
	}
}

// 64 workers on shared and distinct keys get the same answers with calls
// coalesced as without, and coalesced calls did go out together.
func TestCoalescedHammer(t *testing.T) {
	addr := testserver.RedisClient(t).Options().Addr
	for _, mode := range []redisstore.Coalescing{redisstore.CoalesceConcurrent, redisstore.CoalesceOff} {
		t.Run(fmt.Sprintf("Coalescing=%d", mode), func(t *testing.T) {
			h := newPipes()
			client := clientWithHook(t, addr, h, func(o *redis.Options) { o.PoolSize = 64 })
			hammer(t, storeWith(t, client, redisstore.Options{Coalescing: mode}), 10)
			if mode == redisstore.CoalesceOff {
				require.Zero(t, h.batched.Load(), "no pipelines")
				return
			}
			require.Positive(t, h.batched.Load(), "pipelines carried more than one call")
			t.Logf("%d pipelines of more than one call, %.1f calls each", h.batched.Load(),
				float64(h.batchedCmds.Load())/float64(h.batched.Load()))
		})
	}
}

// The same on a real three-master Redis Cluster: each master has its own
// queue, and go-redis's cluster pipeline sends each call to its node.
func TestCoalescedHammerCluster(t *testing.T) {
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testserver.ClusterAddrs(t), PoolSize: 64})
	t.Cleanup(func() { _ = client.Close() })
	h := newPipes()
	client.AddHook(h)
	hammer(t, storeWith(t, client, redisstore.Options{}), 10)
	require.Positive(t, h.batched.Load(), "pipelines carried more than one call")
}

// slotStore returns a store whose client has a pool of one connection, so
// that one call at a time goes out on its own, and its key prefix.
func slotStore(t *testing.T, addr string, h *pipes) (*redisstore.Store, string) {
	t.Helper()
	client := clientWithHook(t, addr, h, func(o *redis.Options) { o.PoolSize = 1 })
	prefix := testserver.Unique("coalesce-test:")
	return storeWith(t, client, redisstore.Options{Prefix: prefix}), prefix
}

// hold starts a call on the key "hold" and returns once it has taken the
// store's one slot, which it keeps until h.held is closed: the calls made
// meanwhile queue. It returns the held call's error.
func hold(t *testing.T, s *redisstore.Store, h *pipes) <-chan error {
	t.Helper()
	return holdKey(t, s, h, "hold")
}

// holdKey is hold on key, whose name must contain "hold".
func holdKey(t *testing.T, s *redisstore.Store, h *pipes, key string) <-chan error {
	t.Helper()
	held := async(func() error {
		_, err := s.Acquire(context.Background(), backends.AcquireRequest{Key: key, Owner: "o", LeaseTTL: time.Minute, Retention: time.Minute})
		return err
	})
	<-h.holding
	return held
}

func async(fn func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	return ch
}

type result struct {
	res backends.AcquireResult
	err error
}

func acquireAsync(ctx context.Context, s backends.Store, key string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		res, err := s.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: "o-" + key, LeaseTTL: time.Minute, Retention: time.Minute})
		ch <- result{res, err}
	}()
	return ch
}

// queued waits until n calls of s are queued.
func queued(t *testing.T, s *redisstore.Store, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return redisstore.QueuedCalls(s) == n }, wait, time.Millisecond, "%d calls queued", n)
}

func acquired(t *testing.T, ch <-chan result) {
	t.Helper()
	r := <-ch
	require.NoError(t, r.err)
	require.Equal(t, backends.StatusAcquired, r.res.Status)
}

// expiring is a context whose deadline passes when expire is called.
type expiring struct {
	context.Context
	deadline time.Time
	done     chan struct{}
}

func newExpiring() *expiring {
	return &expiring{Context: context.Background(), deadline: time.Now().Add(time.Hour), done: make(chan struct{})}
}

func (e *expiring) Deadline() (time.Time, bool) { return e.deadline, true }
func (e *expiring) Done() <-chan struct{}       { return e.done }
func (e *expiring) expire()                     { close(e.done) }

func (e *expiring) Err() error {
	select {
	case <-e.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// A queued call whose context ends leaves the queue and returns its
// context's error at once, while the slot is still taken; it is never
// sent. A call whose context has already ended is not queued. The calls
// queued with it go out together once the slot is free.
func TestDeadlineWhileQueued(t *testing.T) {
	h := newPipes()
	s, _ := slotStore(t, testserver.RedisClient(t).Options().Addr, h)
	held := hold(t, s, h)
	ctx := context.Background()
	a, b := acquireAsync(ctx, s, "a"), acquireAsync(ctx, s, "b")
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	x := acquireAsync(short, s, "x")
	queued(t, s, 3)

	r := <-x
	require.ErrorIs(t, r.err, context.DeadlineExceeded)
	queued(t, s, 2)
	expired, cancel2 := context.WithTimeout(ctx, -time.Second)
	defer cancel2()
	_, err := s.Acquire(expired, backends.AcquireRequest{Key: "y", Owner: "o", LeaseTTL: time.Minute})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	queued(t, s, 2)

	close(h.held)
	require.NoError(t, <-held)
	acquired(t, a)
	acquired(t, b)
	require.EqualValues(t, 1, h.batched.Load(), "a and b went in one pipeline")
	for _, k := range []string{"x", "y"} {
		_, err := s.Inspect(ctx, k)
		require.ErrorIs(t, err, backends.ErrNotFound, "%s was never sent", k)
	}
}

// A call whose context ends while its pipeline is in flight returns at
// once with its context's error; the pipeline goes on for the others, and
// the call's own command runs (its reply is discarded).
func TestDeadlineWhileInFlight(t *testing.T) {
	h := newPipes()
	h.pipeHeld, h.piped = make(chan struct{}), make(chan []string, 1)
	s, _ := slotStore(t, testserver.RedisClient(t).Options().Addr, h)
	held := hold(t, s, h)
	ctx := context.Background()
	a := acquireAsync(ctx, s, "a")
	timed, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	b := acquireAsync(timed, s, "b")
	exp := newExpiring()
	x := acquireAsync(exp, s, "x")
	cancelled, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	y := acquireAsync(cancelled, s, "y")
	queued(t, s, 4)

	close(h.held)
	require.NoError(t, <-held)
	keys := <-h.piped // the pipeline waits from here until pipeHeld is closed
	require.Len(t, keys, 4)
	exp.expire()
	r := <-x
	require.ErrorIs(t, r.err, context.DeadlineExceeded)
	cancel2()
	r = <-y
	require.ErrorIs(t, r.err, context.Canceled)

	close(h.pipeHeld)
	acquired(t, a)
	acquired(t, b)
	for _, k := range []string{"x", "y"} {
		rec, err := s.Inspect(ctx, k)
		require.NoError(t, err, "%s ran", k)
		require.Equal(t, "o-"+k, rec.Owner)
	}
}

// One call failing in a pipeline (its key holds a list, so its command
// gets WRONGTYPE) fails that call alone, with ErrRejected.
func TestOneFailedCallInAPipeline(t *testing.T) {
	shared := testserver.RedisClient(t)
	h := newPipes()
	h.pipeHeld, h.piped = make(chan struct{}), make(chan []string, 1)
	close(h.pipeHeld)
	s, prefix := slotStore(t, shared.Options().Addr, h)
	ctx := context.Background()
	require.NoError(t, shared.RPush(ctx, prefix+"wrong", "not a record").Err())
	t.Cleanup(func() { shared.Del(context.Background(), prefix+"wrong") })
	held := hold(t, s, h)
	a, w, b := acquireAsync(ctx, s, "a"), acquireAsync(ctx, s, "wrong"), acquireAsync(ctx, s, "b")
	queued(t, s, 3)

	close(h.held)
	require.NoError(t, <-held)
	require.Len(t, <-h.piped, 3, "the three calls went in one pipeline")
	r := <-w
	require.ErrorIs(t, r.err, backends.ErrRejected)
	require.ErrorContains(t, r.err, "WRONGTYPE")
	acquired(t, a)
	acquired(t, b)
}

// Queued calls whose script the server no longer has (SCRIPT FLUSH while
// they waited) get NOSCRIPT in their pipeline and are sent again with
// EVAL, without an error.
func TestNoScriptInAPipeline(t *testing.T) {
	r := testserver.StartRedis(t)
	admin := clientWithHook(t, r.Addr(), nil)
	h := newPipes()
	s, _ := slotStore(t, r.Addr(), h)
	ctx := context.Background()
	var leases []backends.Lease
	for _, k := range []string{"a", "b", "c"} {
		res, err := s.Acquire(ctx, backends.AcquireRequest{Key: k, Owner: "o", LeaseTTL: time.Minute, Retention: time.Minute})
		require.NoError(t, err)
		leases = append(leases, res.Lease)
	}
	held := hold(t, s, h)
	var done []<-chan error
	for _, l := range leases {
		done = append(done, async(func() error { return s.Complete(ctx, l, nil) }))
	}
	queued(t, s, 3)
	require.NoError(t, admin.ScriptFlush(ctx).Err())

	close(h.held)
	require.NoError(t, <-held)
	for _, d := range done {
		require.NoError(t, <-d)
	}
	require.EqualValues(t, 3, h.pipeNoScript.Load(), "the pipeline got NOSCRIPT")
	require.EqualValues(t, 3, h.evals.Load(), "and its calls went again with EVAL")
	for _, k := range []string{"a", "b", "c"} {
		rec, err := s.Inspect(ctx, k)
		require.NoError(t, err)
		require.Equal(t, backends.StateCompleted, rec.State)
	}
}

// SCRIPT FLUSH over and over while 64 workers hammer the store: no call
// fails.
func TestScriptFlushMidHammer(t *testing.T) {
	r := testserver.StartRedis(t)
	admin := clientWithHook(t, r.Addr(), nil)
	h := newPipes()
	client := clientWithHook(t, r.Addr(), h, func(o *redis.Options) { o.PoolSize = 64 })
	s := storeWith(t, client, redisstore.Options{})
	require.NoError(t, admin.ScriptFlush(context.Background()).Err())
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			assert.NoError(t, admin.ScriptFlush(context.Background()).Err())
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	hammer(t, s, 5)
	close(done)
	wg.Wait()
	require.Positive(t, h.noScript.Load(), "calls met NOSCRIPT")
	require.Positive(t, h.batched.Load())
	t.Logf("%d NOSCRIPT replies, %d of them in pipelines, %d calls sent again with EVAL in pipelines",
		h.noScript.Load(), h.pipeNoScript.Load(), h.evals.Load())
}

// A pipeline that fails as a whole (its connection lost) fails every
// call in it with its error; none is left without a reply or given
// another's.
func TestPipelineErrorReachesEveryCaller(t *testing.T) {
	h := newPipes()
	s, _ := slotStore(t, testserver.RedisClient(t).Options().Addr, h)
	held := hold(t, s, h)
	ctx := context.Background()
	calls := []<-chan result{acquireAsync(ctx, s, "a"), acquireAsync(ctx, s, "b"), acquireAsync(ctx, s, "c")}
	queued(t, s, 3)
	lost := errors.New("connection lost mid-pipeline")
	h.fail.Store(&lost)

	close(h.held)
	require.NoError(t, <-held)
	for i, ch := range calls {
		r := <-ch
		require.ErrorIs(t, r.err, lost, "call %d", i)
		require.Zero(t, r.res, "call %d", i)
	}
	require.EqualValues(t, 1, h.batched.Load(), "the three went in one pipeline")
	h.fail.Store(nil)
	for _, k := range []string{"a", "b", "c"} {
		_, err := s.Inspect(ctx, k)
		require.ErrorIs(t, err, backends.ErrNotFound, "%s never reached the server", k)
	}
}

// Round trips that make no progress (a slow command, a dead connection)
// do not hold back the calls that arrive after them: once they have been
// stuck for a moment, the queue goes on another connection. With a pool
// of four, the store sends two calls on their own at once; both are stuck
// here, so the next calls queue.
func TestStalledRoundTripDoesNotHoldBackOthers(t *testing.T) {
	h := newPipes()
	client := clientWithHook(t, testserver.RedisClient(t).Options().Addr, h, func(o *redis.Options) { o.PoolSize = 4 })
	s := storeWith(t, client, redisstore.Options{})
	held, held2 := holdKey(t, s, h, "hold-1"), holdKey(t, s, h, "hold-2")
	ctx := context.Background()
	for _, k := range []string{"a", "b"} {
		select {
		case r := <-acquireAsync(ctx, s, k):
			require.NoError(t, r.err)
			require.Equal(t, backends.StatusAcquired, r.res.Status)
		case <-time.After(wait):
			t.Fatalf("%s waited behind the stuck round trip", k)
		}
	}
	close(h.held)
	require.NoError(t, <-held)
	require.NoError(t, <-held2)
}

// While pipelines of the queue are in flight, the queue goes in another
// one, on another connection, once it holds four calls and half as many
// as those in flight carry on average; never more than four at once.
// Here every pipeline is held on its way to the server, and no stall
// escape sends the queue on early. With a pool of eight, the store sends
// four calls on their own at once: four held calls make the rest queue.
func TestMorePipelinesOnceTheQueueFills(t *testing.T) {
	for _, tc := range []struct {
		first int
		more  []int // the calls the second, third and fourth take
	}{
		{3, []int{4, 4, 4}},
		{20, []int{10, 8, 7}}, // half of 20, of (20+10)/2, of (20+10+8)/3, rounded up
	} {
		t.Run(fmt.Sprintf("first=%d", tc.first), func(t *testing.T) {
			h := newPipes()
			h.pipeHeld, h.piped = make(chan struct{}), make(chan []string, 64)
			client := clientWithHook(t, testserver.RedisClient(t).Options().Addr, h, func(o *redis.Options) { o.PoolSize = 8 })
			s := storeWith(t, client, redisstore.Options{})
			redisstore.NoStallEscape(s)
			ctx := context.Background()
			var calls []<-chan result
			call := func(n int) {
				for range n {
					calls = append(calls, acquireAsync(ctx, s, fmt.Sprintf("k%d", len(calls))))
				}
			}
			var held []<-chan error
			for i := range 4 {
				held = append(held, holdKey(t, s, h, fmt.Sprintf("hold-%d", i)))
			}
			call(tc.first)
			queued(t, s, tc.first)
			close(h.held)
			require.Len(t, <-h.piped, tc.first, "the first pipeline took the queue")

			for i, n := range tc.more {
				call(n - 1)
				queued(t, s, n-1) // too few for another pipeline
				call(1)
				select {
				case keys := <-h.piped:
					require.Len(t, keys, n, "pipeline %d took the queue", i+2)
				case <-time.After(wait):
					t.Fatalf("no pipeline %d", i+2)
				}
			}
			call(tc.first)
			queued(t, s, tc.first) // no fifth pipeline took them

			close(h.pipeHeld)
			for _, ch := range held {
				require.NoError(t, <-ch)
			}
			for _, ch := range calls {
				acquired(t, ch)
			}
		})
	}
}

// trips counts the store's round trips: single calls and pipelines.
type trips struct{ n atomic.Int64 }

func (h *trips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *trips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if storeCalls([]redis.Cmder{cmd}) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *trips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if storeCalls(cmds) {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// Workers that call again as soon as their reply comes, as handlers do
// (Acquire, Complete, the next message's Acquire), join the batch that
// goes next rather than the one after it: on one processor, sixteen of
// them in a loop, more than the eight calls the store sends on their own,
// share round trips. Were the lane to take its next batch before they could
// call again, or to send calls on their own while it drains, it would
// need a round trip per two calls or more.
func TestCallersThatCallAgainJoinTheNextBatch(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	h := &trips{}
	client := clientWithHook(t, testserver.RedisClient(t).Options().Addr, h, func(o *redis.Options) { o.PoolSize = 32 })
	s := storeWith(t, client, redisstore.Options{})
	const workers, calls = 16, 125
	loop(t, s, workers, calls, false)
	n := h.n.Load()
	t.Logf("%d calls in %d round trips", workers*calls, n)
	require.Less(t, n, int64(workers*calls/2), "fewer round trips than one per two calls")
}

// As many callers as the calls the store sends on their own (four with a
// pool of eight), each with one call at a time, never queue: every call
// is its own round trip, sent on the caller's goroutine, as without
// coalescing. Handing a few calls to another goroutine costs more CPU
// than the round trips it saves (docs/redis.md).
func TestFewCallersGoOnTheirOwn(t *testing.T) {
	h := newPipes()
	client := clientWithHook(t, testserver.RedisClient(t).Options().Addr, h, func(o *redis.Options) { o.PoolSize = 8 })
	s := storeWith(t, client, redisstore.Options{Prefix: testserver.Unique("coalesce-test:")})
	loop(t, s, 4, 250, true)
	require.Zero(t, h.batched.Load(), "no call queued for a pipeline")
}

// loop runs workers that each acquire calls fresh keys of their own one
// after the other, as handlers do, completing each if complete is set.
func loop(t *testing.T, s backends.Store, workers, calls int, complete bool) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				res, err := s.Acquire(ctx, backends.AcquireRequest{Key: fmt.Sprintf("w%d-%d", w, i), Owner: "o",
					LeaseTTL: time.Minute, Retention: time.Minute})
				if !assert.NoError(t, err) || !assert.Equal(t, backends.StatusAcquired, res.Status) {
					return
				}
				if complete {
					assert.NoError(t, s.Complete(ctx, res.Lease, nil))
				}
			}
		})
	}
	wg.Wait()
}
