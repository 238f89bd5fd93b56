package redisstore

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/internal/stack"
)

// How calls are coalesced.
const (
	// maxBatch is the most calls one pipeline carries.
	maxBatch = 128
	// stallAfter is how long a lane's round trips may make no progress
	// (none starts or ends) while calls queue before the lane sends the
	// queue on another connection: a round trip that slow is stuck
	// behind a slow command or a dead connection, and the calls behind
	// it (renewals among them) must not wait for it.
	stallAfter = 10 * time.Millisecond
	// laneDirect is how many calls one lane sends at once, each on its
	// own, while no call waits (capped at half the client's pool size).
	laneDirect = 8
	// laneSlots is how many more round trips one lane keeps in flight at
	// most when they stall (capped at the client's pool size).
	laneSlots = 4
	// laneDepth is how many pipelines of a lane's queue may be in flight
	// at once, each on a connection of its own (more only after a stall).
	laneDepth = 4
	// moreBatch is the fewest calls a pipeline of the queue carries while
	// another is in flight: fewer are left to those in flight.
	moreBatch = 4
)

// coalescer sends the store's commands. While fewer than laneDirect calls
// of a lane are in flight and none waits, a call is sent at once, on its
// own, on the caller's goroutine, as without coalescing: a few callers
// cost less that way than handing their calls to another goroutine. A
// call that finds them all in flight queues; the first of them to end
// takes the queue and sends it as one pipeline (group commit), then the
// calls queued meanwhile, and so on (it drains the lane), while the next
// batch collects. While a lane drains, every call queues. Once the queue
// holds moreBatch calls and half as many as the pipelines in flight carry
// on average, it goes in another pipeline on another connection, without
// waiting for them (at most laneDepth in flight): the server runs one
// batch while the client reads another's replies and its callers make
// their next calls, where with one pipeline in flight each side waits for
// the other, and both sit idle for the wake-ups between. When the queue
// is empty the lane goes back to sending calls on their own. No call ever
// waits for a timer. Only when the lane's round trips make no progress
// for stallAfter does it send the queue on yet another connection, up to
// laneSlots more at once; it goes back to laneDepth as they end. A
// Cluster gets one lane per master, so a slow node holds back only the
// calls for its own keys.
type coalescer struct {
	client redis.UniversalClient
	// pipeline returns a new pipeline on client; nil when coalescing is
	// off: then every call is its own round trip.
	pipeline func() redis.Pipeliner
	// cluster, when set, chooses a key's lane by its master.
	cluster *redis.ClusterClient
	direct  int           // laneDirect, capped
	slots   int           // direct + laneSlots, capped
	stall   time.Duration // stallAfter

	lane  lane // the only lane, or the lane of keys whose master is unknown
	mu    sync.RWMutex
	lanes map[string]*lane // a Cluster's lanes by master address
}

// lane is a queue of calls and the round trips in flight that serve it.
// While the queue is not empty, a round trip is in flight: when it ends,
// it takes the queue, or leaves it to the others in flight (next).
type lane struct {
	mu       sync.Mutex
	inflight int
	drainers int // round trips in flight that drain the queue
	flying   int // calls in those round trips
	queue    []*call
	// moved counts the round trips started and ended: a stall timer that
	// finds it unchanged found the lane stuck.
	moved uint64
	timer bool // a stall timer is armed
}

// call is one command, a script run or a plain command.
type call struct {
	ctx    context.Context
	script *script       // the command's script; nil for a plain command
	args   []any         // the command
	cmd    *redis.Cmd    // the reply, set before done receives
	done   chan struct{} // receives once cmd is set (capacity 1)
	taken  bool          // in a batch; guarded by the lane's mu
}

// callPool keeps calls for reuse: a call whose caller had its reply is
// free again. One whose caller's context ended first is left to the
// garbage collector, as a batch may still hold it.
var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func newCall(ctx context.Context, script *script, args []any) *call {
	cl := callPool.Get().(*call)
	cl.ctx, cl.script, cl.args = ctx, script, args
	return cl
}

// free returns the reply of cl, which its caller received, and puts cl
// back for reuse.
func (cl *call) free() *redis.Cmd {
	cmd := cl.cmd
	*cl = call{done: cl.done}
	callPool.Put(cl)
	return cmd
}

func newCoalescer(client redis.UniversalClient, off bool, poolSize int) *coalescer {
	c := &coalescer{client: client, direct: laneDirect, slots: laneDirect + laneSlots, stall: stallAfter}
	if poolSize > 0 {
		c.direct = max(1, min(c.direct, poolSize/2))
		c.slots = max(c.direct, min(c.slots, poolSize))
	}
	if off {
		return c
	}
	c.pipeline = client.Pipeline
	if cc, ok := client.(*redis.ClusterClient); ok {
		c.cluster = cc
		c.lanes = map[string]*lane{}
	}
	return c
}

// run runs script on key with argv and returns its reply.
func (c *coalescer) run(ctx context.Context, script *script, key string, argv ...any) *redis.Cmd {
	cmd := script.command(key, argv)
	if c.pipeline == nil {
		return script.run(ctx, c.client, cmd)
	}
	l := c.laneFor(ctx, key)
	if !l.enter(c) {
		return c.queue(l, newCall(ctx, script, cmd))
	}
	reply := script.run(ctx, c.client, cmd)
	c.leave(l)
	return reply
}

// do sends the command args on key, as client.Do would, and returns its
// reply.
func (c *coalescer) do(ctx context.Context, key string, args ...any) *redis.Cmd {
	if c.pipeline == nil {
		return c.client.Do(ctx, args...)
	}
	l := c.laneFor(ctx, key)
	if !l.enter(c) {
		return c.queue(l, newCall(ctx, nil, args))
	}
	cmd := c.client.Do(ctx, args...)
	c.leave(l)
	return cmd
}

// run and do send a call on the caller's goroutine, or queue it with
// queue. That goroutine is often a handler's, started for its message with
// a small stack: the round trip is its deepest point, and each frame added
// on the way there can make the stack grow, and be copied, once more per
// message (runtime.newstack took 13% of the process's CPU samples in
// benchmarks/e2ebench when each call went through two more frames, 7%
// without them). So the direct path adds no frame around the client's
// call but script.run's, where go-redis's Script.Run would add three, and
// the queue's select lives in a function of its own.

// enter takes a round trip slot of l for a call sent on its own (true),
// or leaves the caller to queue its call (false): when direct calls are
// in flight, or l drains its queue. The caller of a true enter calls leave
// once its round trip ends; a false enter leaves l.mu locked, for queue.
func (l *lane) enter(c *coalescer) bool {
	l.mu.Lock()
	if l.inflight >= c.direct || l.drainers > 0 || len(l.queue) > 0 {
		return false
	}
	l.inflight++
	l.moved++
	l.mu.Unlock()
	return true
}

// leave ends a round trip entered with enter. If calls queued meanwhile
// and no round trip drains them, it starts draining them on a goroutine of
// its own: the caller returns with its reply.
func (c *coalescer) leave(l *lane) {
	if batch, ok := l.next(c, nil, false, 0); ok {
		go c.drain(l, batch)
	}
}

// queue queues cl for l's next pipeline and waits for its reply. It is
// called with l.mu locked, by a false enter. A queued call whose ctx ends
// before its reply returns at once with the context's error, and is never
// sent if it was still waiting; one already sent leaves its reply to be
// discarded.
func (c *coalescer) queue(l *lane, cl *call) *redis.Cmd {
	ctx := cl.ctx
	if err := ctx.Err(); err != nil {
		l.mu.Unlock()
		return failed(ctx, err)
	}
	l.queue = append(l.queue, cl)
	c.arm(l)
	var batch []*call
	if l.drainers > 0 && l.inflight < c.slots && l.another(l.drainers) {
		batch = l.open()
	}
	l.mu.Unlock()
	if batch != nil {
		go c.drain(l, batch)
	}

	select {
	case <-cl.done:
		return cl.free()
	case <-ctx.Done():
		select {
		case <-cl.done: // the reply came as the context ended
			return cl.free()
		default:
		}
		l.mu.Lock()
		if !cl.taken {
			if i := slices.Index(l.queue, cl); i >= 0 {
				l.queue = slices.Delete(l.queue, i, i+1)
			}
		}
		l.mu.Unlock()
		return failed(ctx, ctx.Err())
	}
}

// laneFor returns the lane of key.
func (c *coalescer) laneFor(ctx context.Context, key string) *lane {
	if c.cluster == nil {
		return &c.lane
	}
	master, err := c.cluster.MasterForKey(ctx, key)
	if err != nil {
		return &c.lane
	}
	addr := master.Options().Addr
	c.mu.RLock()
	l := c.lanes[addr]
	c.mu.RUnlock()
	if l != nil {
		return l
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l = c.lanes[addr]; l == nil {
		l = &lane{}
		c.lanes[addr] = l
	}
	return l
}

// another says whether the queue goes in a pipeline of its own while
// others of the lane's pipelines are in flight: it must hold moreBatch
// calls and half as many as they carry on average, and no more than
// laneDepth pipelines go at once. The caller holds l.mu.
func (l *lane) another(others int) bool {
	n := len(l.queue)
	return others < laneDepth && n >= moreBatch && 2*n*others >= l.flying
}

// open takes a slot of l for a new pipeline of the queue, and the calls
// it carries. The caller holds l.mu.
func (l *lane) open() []*call {
	l.inflight++
	l.drainers++
	l.moved++
	return l.take(nil)
}

// next is called as a round trip of l ends: a pipeline of the queue
// (drainer) that carried sent calls, or a call sent on its own. If calls
// are queued and no other round trip drains the lane, or another would
// take them (another), it takes them for the next round trip on the same
// slot (ok), as one of the lane's drainers. Otherwise it gives the slot
// back, leaving the queue to the drainers in flight: after a stall, the
// lane goes back to laneDepth pipelines in flight at most.
func (l *lane) next(c *coalescer, buf []*call, drainer bool, sent int) (batch []*call, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.moved++
	l.flying -= sent
	if !drainer {
		l.drainers++ // if it takes the queue, it drains it from now on
	}
	others := l.drainers - 1
	if len(l.queue) > 0 && (others == 0 || drainer && l.another(others)) {
		return l.take(buf), true
	}
	l.drainers--
	l.inflight--
	if len(l.queue) > 0 {
		c.arm(l)
	}
	return nil, false
}

// drain sends batch, then the calls queued meanwhile, until next gives
// the slot back. Between two round trips it yields the processor once
// (runtime.Gosched, not a timer: with nothing else to run it returns at
// once): the callers the last round trip answered are runnable, and those
// that call again straight away, as a handler's next Acquire follows its
// Complete, join the next batch instead of waiting a round trip more
// behind it. Each round trip costs both processes a write, a read and a
// wake-up, whatever it carries, so fewer, fuller ones cost less CPU. A
// drain runs on a goroutine started for it, which goes down to the socket:
// its stack is grown first (stack.Grow; runtime.newstack took 3.7% of the
// client's CPU in redisbench (e) without it, 0.9% with it).
func (c *coalescer) drain(l *lane, batch []*call) {
	stack.Grow()
	for ok := true; ok; batch, ok = l.next(c, batch[:0], true, len(batch)) {
		c.send(batch)
		runtime.Gosched()
	}
}

// arm starts a stall timer for l unless one is armed or every slot is
// taken. The caller holds l.mu.
func (c *coalescer) arm(l *lane) {
	if l.timer || l.inflight >= c.slots {
		return
	}
	l.timer = true
	mark := l.moved
	time.AfterFunc(c.stall, func() { c.stalled(l, mark) })
}

// stalled runs stallAfter after arm: if no round trip of l started or
// ended since (moved is still mark) while calls queue, it sends them on a
// slot of their own.
func (c *coalescer) stalled(l *lane, mark uint64) {
	l.mu.Lock()
	l.timer = false
	if len(l.queue) == 0 {
		l.mu.Unlock()
		return
	}
	if l.moved != mark || l.inflight >= c.slots {
		c.arm(l)
		l.mu.Unlock()
		return
	}
	batch := l.open()
	l.mu.Unlock()
	c.drain(l, batch)
}

// take moves up to maxBatch calls from the head of the queue to buf,
// leaving out those whose context has ended: they return on their own.
// They count as flying until the drainer that sends them passes their
// number to next. The caller holds l.mu.
func (l *lane) take(buf []*call) []*call {
	clear(buf[:cap(buf)])
	n := min(len(l.queue), maxBatch)
	for _, cl := range l.queue[:n] {
		cl.taken = true
		if cl.ctx.Err() == nil {
			buf = append(buf, cl)
		}
	}
	rest := copy(l.queue, l.queue[n:])
	clear(l.queue[rest:])
	l.queue = l.queue[:rest]
	l.flying += len(buf)
	return buf
}

// sendOne sends cl on its own, with its own context.
func (c *coalescer) sendOne(cl *call) {
	if cl.script != nil {
		cl.cmd = cl.script.run(cl.ctx, c.client, cl.args)
	} else {
		cl.cmd = c.client.Do(cl.ctx, cl.args...)
	}
}

// send runs the calls of batch and hands each its reply. One call alone
// is sent as sendOne sends it. Several go in one pipeline, scripts as
// EVALSHA, under a context that no one caller can cancel and that ends at
// the latest of their deadlines; the scripts the server did not have are
// sent again with EVAL.
func (c *coalescer) send(batch []*call) {
	switch len(batch) {
	case 0:
		return
	case 1:
		cl := batch[0]
		c.sendOne(cl)
		cl.done <- struct{}{}
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	p := c.pipeline()
	for _, cl := range batch {
		cl.cmd = p.Do(ctx, cl.args...)
	}
	_, err := p.Exec(ctx)
	retry := batch[:0:0]
	for _, cl := range batch {
		if cl.script != nil && noScript(cl.cmd.Err()) {
			retry = append(retry, cl)
			continue
		}
		settle(cl, err)
	}
	if len(retry) == 0 {
		return
	}
	for _, cl := range retry {
		cl.cmd = p.Do(ctx, cl.script.eval(cl.args)...)
	}
	_, err = p.Exec(ctx)
	for _, cl := range retry {
		settle(cl, err)
	}
}

// settle hands cl its reply. A command the pipeline never filled in gets
// the pipeline's error.
func settle(cl *call, pipeErr error) {
	if pipeErr != nil && cl.cmd.Err() == nil && cl.cmd.Val() == nil {
		cl.cmd.SetErr(pipeErr)
	}
	cl.done <- struct{}{}
}

// batchContext returns a context with the values of the batch's first
// call, no cancellation, and the latest deadline of the batch's calls, or
// none if one of them has none.
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(batch[0].ctx)
	var latest time.Time
	for _, cl := range batch {
		d, ok := cl.ctx.Deadline()
		if !ok {
			return base, func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(base, latest)
}

func noScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// failed returns a reply that failed with err.
func failed(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}
