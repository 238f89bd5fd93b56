package pgstore

import (
	"bytes"
	"context"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// maxBatch bounds the calls sent in one batch.
const maxBatch = 64

// batcher sends the store's Acquire, Complete and Release calls to
// Postgres, through a [storekit.Batcher]: a call that finds fewer than max
// batches in flight is sent at once, alone, as it would be without the
// batcher; the calls that queue meanwhile go together as one pgx batch:
// one round trip and one transaction, so one commit, for all of them.
//
// A batch is one transaction: its calls take their rows' locks in key
// order, so that two batches (of this process or another) never wait for
// each other in a cycle, and a call's row stays locked until the batch
// commits. If Postgres refuses any of its statements, the transaction
// rolled back and wrote nothing, and each call is sent again alone, so
// that one call's error is never another's.
type batcher struct {
	pool  *pgxpool.Pool
	calls *storekit.Batcher[*call]
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
}

func newBatcher(pool *pgxpool.Pool, max int) *batcher {
	b := &batcher{pool: pool}
	b.calls = storekit.NewBatcher(max, maxBatch, b.send)
	return b
}

// do sends c, alone or in a batch, and returns its error.
func (b *batcher) do(c *call) error {
	if err := b.calls.Do(c.ctx, c); err != nil {
		return err
	}
	return c.err
}

// send runs calls: alone if it holds one, else as one pgx
// batch, and each again alone if Postgres refused any of them.
func (b *batcher) send(calls []*call) {
	if len(calls) == 1 {
		b.alone(calls[0])
		return
	}
	sorted := slices.Clone(calls)
	slices.SortStableFunc(sorted, func(x, y *call) int { return bytes.Compare(x.key, y.key) })
	// The batch runs for its callers together: until the latest of their
	// deadlines, whichever of them gave up meanwhile.
	ctxs := make([]context.Context, len(calls))
	for i, c := range calls {
		ctxs[i] = c.ctx
	}
	ctx, cancel := storekit.BatchContext(ctxs...)
	defer cancel()
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
