package redisstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// How calls are coalesced.
const (
	// laneSlots is how many round trips one lane keeps in flight at most
	// (capped at the client's pool size). A call that finds a slot free
	// is sent at once, on its own; calls that arrive while every slot is
	// busy wait for the next free slot and go together, in one pipeline.
	laneSlots = 4
	// maxBatch is the most calls one pipeline carries.
	maxBatch = 128
)

// coalescer runs the store's scripts. Calls that arrive while a lane's
// slots are all busy are sent together in the next pipeline (group
// commit); no call ever waits for a timer. A Cluster gets one lane per
// master, so a slow node holds back only the calls for its own keys.
type coalescer struct {
	client redis.UniversalClient
	// pipeline returns a new pipeline on client; nil when coalescing is
	// off: then every call is its own round trip.
	pipeline func() redis.Pipeliner
	// cluster, when set, chooses a key's lane by its master.
	cluster *redis.ClusterClient
	slots   int

	lane  lane // the only lane, or the lane of keys whose master is unknown
	mu    sync.RWMutex
	lanes map[string]*lane // a Cluster's lanes by master address
}

// lane is a queue of calls and the round trips in flight that serve it.
// While the queue is not empty, every slot is busy: a slot that frees
// takes the queue's head.
type lane struct {
	mu       sync.Mutex
	inflight int
	queue    []*call
}

// call is one queued script call.
type call struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd    // the reply, set before done is closed
	done   chan struct{} // closed once cmd is set
	taken  bool          // in a batch; guarded by the lane's mu
}

func newCoalescer(client redis.UniversalClient, off bool, poolSize int) *coalescer {
	c := &coalescer{client: client, slots: laneSlots}
	if poolSize > 0 && poolSize < c.slots {
		c.slots = poolSize
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

// run runs script on keys (one key) and args, as script.Run would, and
// returns its reply. A queued call whose ctx ends before its reply
// returns at once with the context's error, and is never sent if it was
// still waiting; one already sent leaves its reply to be discarded.
func (c *coalescer) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	if c.pipeline == nil {
		return script.Run(ctx, c.client, keys, args...)
	}
	l := c.laneFor(ctx, keys[0])
	l.mu.Lock()
	if l.inflight < c.slots {
		l.inflight++
		l.mu.Unlock()
		return c.alone(ctx, l, script, keys, args)
	}
	if err := ctx.Err(); err != nil {
		l.mu.Unlock()
		return failed(ctx, err)
	}
	cl := &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	l.queue = append(l.queue, cl)
	l.mu.Unlock()

	select {
	case <-cl.done:
		return cl.cmd
	case <-ctx.Done():
		select {
		case <-cl.done: // the reply came as the context ended
			return cl.cmd
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

// alone runs one call on a slot of l, then frees the slot.
func (c *coalescer) alone(ctx context.Context, l *lane, script *redis.Script, keys []string, args []any) *redis.Cmd {
	defer c.free(l)
	return script.Run(ctx, c.client, keys, args...)
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

// free gives back a slot of l after a round trip, or passes it on to a
// new goroutine that sends what has queued meanwhile.
func (c *coalescer) free(l *lane) {
	l.mu.Lock()
	if len(l.queue) == 0 {
		l.inflight--
		l.mu.Unlock()
		return
	}
	batch := l.take(nil)
	l.mu.Unlock()
	go c.drain(l, batch)
}

// drain sends batch, then the calls queued meanwhile, until the queue is
// empty; it holds one of l's slots throughout.
func (c *coalescer) drain(l *lane, batch []*call) {
	for {
		c.send(batch)
		l.mu.Lock()
		if len(l.queue) == 0 {
			l.inflight--
			l.mu.Unlock()
			return
		}
		batch = l.take(batch[:0])
		l.mu.Unlock()
	}
}

// take moves up to maxBatch calls from the head of the queue to buf,
// leaving out those whose context has ended: they return on their own.
// The caller holds l.mu.
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
	return buf
}

// send runs the calls of batch and hands each its reply. One call alone
// is sent as script.Run would send it, with its own context. Several go
// in one pipeline of EVALSHA, under a context that no one caller can
// cancel and that ends at the latest of their deadlines; the calls whose
// script the server did not have are sent again with EVAL.
func (c *coalescer) send(batch []*call) {
	switch len(batch) {
	case 0:
		return
	case 1:
		cl := batch[0]
		cl.cmd = cl.script.Run(cl.ctx, c.client, cl.keys, cl.args...)
		close(cl.done)
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	p := c.pipeline()
	for _, cl := range batch {
		cl.cmd = cl.script.EvalSha(ctx, p, cl.keys, cl.args...)
	}
	_, err := p.Exec(ctx)
	retry := batch[:0:0]
	for _, cl := range batch {
		if noScript(cl.cmd.Err()) {
			retry = append(retry, cl)
			continue
		}
		settle(cl, err)
	}
	if len(retry) == 0 {
		return
	}
	for _, cl := range retry {
		cl.cmd = cl.script.Eval(ctx, p, cl.keys, cl.args...)
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
	close(cl.done)
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
