package pgstore

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// maxBatch bounds the calls sent in one batch.
const maxBatch = 64

// batcher sends the store's Acquire, Complete and Release calls to
// Postgres. A call that finds fewer than max batches in
// flight is sent at once, alone, as it would be without the batcher: a
// lone caller waits for nothing. The calls that arrive while max batches
// fly queue, and the first of them, once a batch has come back, sends
// all that queued meanwhile as one pgx batch: one round trip and one
// transaction, so one commit, for all of them.
//
// A batch is one transaction: its calls take their rows' locks in key
// order, so that two batches (of this process or another) never wait for
// each other in a cycle, and a call's row stays locked until the batch
// commits. If Postgres refuses any of its statements, the transaction
// rolled back and wrote nothing, and each call is sent again alone, so
// that one call's error is never another's.
type batcher struct {
	pool *pgxpool.Pool
	max  int

	mu       sync.Mutex
	inflight int
	queue    []*call
}

// call is one statement: a query of one row scanned into dest, or, with
// dest nil, a statement whose command tag is kept.
type call struct {
	ctx  context.Context
	key  []byte
	sql  string
	args []any
	dest []any

	tag pgconn.CommandTag
	err error
	// ready receives nil once the call's batch has come back, or the batch
	// this call is to send, which begins with it.
	ready chan []*call
}

func newBatcher(pool *pgxpool.Pool, max int) *batcher {
	return &batcher{pool: pool, max: max}
}

// do sends c, alone or in a batch, and returns its error.
func (b *batcher) do(c *call) error {
	b.mu.Lock()
	if b.inflight < b.max {
		b.inflight++
		b.mu.Unlock()
		b.lead([]*call{c})
		return c.err
	}
	c.ready = make(chan []*call, 1)
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	var batch []*call
	select {
	case batch = <-c.ready:
	case <-c.ctx.Done():
		b.mu.Lock()
		if i := slices.Index(b.queue, c); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
			b.mu.Unlock()
			return c.ctx.Err()
		}
		b.mu.Unlock()
		// Taken already: its batch is on its way, or it is to send one.
		batch = <-c.ready
	}
	if batch != nil {
		b.lead(batch)
	}
	return c.err
}

// lead sends batch, whose first call is the caller's, then hands what
// queued meanwhile to the first of those calls, or gives its slot back.
func (b *batcher) lead(batch []*call) {
	b.send(batch)
	b.mu.Lock()
	next := b.queue
	if len(next) > maxBatch {
		b.queue = slices.Clone(next[maxBatch:])
		next = next[:maxBatch]
	} else {
		b.queue = nil
	}
	if len(next) == 0 {
		b.inflight--
	}
	b.mu.Unlock()
	for _, c := range batch[1:] {
		c.ready <- nil
	}
	if len(next) > 0 {
		next[0].ready <- next
	}
}

// send runs the calls of batch: alone if it holds one, else as one pgx
// batch, and each again alone if Postgres refused any of them.
func (b *batcher) send(batch []*call) {
	if len(batch) == 1 {
		b.alone(batch[0])
		return
	}
	sorted := slices.Clone(batch)
	slices.SortStableFunc(sorted, func(x, y *call) int { return bytes.Compare(x.key, y.key) })
	// The batch runs for its callers together: until the latest of their
	// deadlines, whichever of them gave up meanwhile.
	ctx := context.WithoutCancel(batch[0].ctx)
	var latest time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	if !latest.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	var pb pgx.Batch
	for _, c := range sorted {
		pb.Queue(c.sql, c.args...)
	}
	br := b.pool.SendBatch(ctx, &pb)
	for _, c := range sorted {
		if c.dest != nil {
			c.err = br.QueryRow().Scan(c.dest...)
		} else {
			c.tag, c.err = br.Exec()
		}
	}
	err := br.Close()
	var pgErr *pgconn.PgError
	for _, c := range sorted {
		if errors.As(c.err, &pgErr) || errors.As(err, &pgErr) {
			// Refused: the batch's transaction rolled back, every call
			// with it. Each is sent again, alone.
			for _, c := range sorted {
				b.alone(c)
			}
			return
		}
	}
	if err != nil {
		for _, c := range sorted {
			if c.err == nil {
				c.err = err // the commit's fate is unknown
			}
		}
	}
}

// alone runs c by itself, with its own context.
func (b *batcher) alone(c *call) {
	if c.dest != nil {
		c.tag, c.err = pgconn.CommandTag{}, b.pool.QueryRow(c.ctx, c.sql, c.args...).Scan(c.dest...)
		return
	}
	c.tag, c.err = b.pool.Exec(c.ctx, c.sql, c.args...)
}
