package mysqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// maxBatch bounds the Acquire calls sent in one statement. MariaDB's cost
// per call falls from about 170 µs of CPU alone to about 55 in a
// statement of four and 25 in one of sixteen (docs/benchmarks.md).
const maxBatch = 16

// acquireCall is one Acquire's first statement: the row it left, or the
// error it met.
type acquireCall struct {
	ctx context.Context
	p   *params
	row acquired
	err error
}

// sendFirst runs "acquire first" for calls (see send). A failed
// statement wrote nothing, and a row that a statement whose rows did not
// come back one per call in order did insert reads again, alone, as its
// owner's own lease, which the upsert gives back to it.
func (s *Store) sendFirst(calls []*acquireCall) {
	send(calls, func(c *acquireCall) []byte { return c.p.key }, s.firstAlone, s.firstTogether)
}

// send runs a batch of calls: alone, with its own context, if there is
// one; else together for those with distinct keys, in key order, so that
// two batches never wait for each other's rows in a cycle, and then,
// alone, each call whose key came earlier in the batch, so that it sees
// that call's outcome as a call after it would. If together fails, each
// of its calls runs again alone, so that one call's error is never
// another's.
func send[C any](calls []C, key func(C) []byte, alone func(C), together func([]C) error) {
	if len(calls) == 1 {
		alone(calls[0])
		return
	}
	sorted := slices.Clone(calls)
	slices.SortStableFunc(sorted, func(x, y C) int { return bytes.Compare(key(x), key(y)) })
	var distinct, again []C
	for i, c := range sorted {
		if i > 0 && bytes.Equal(key(c), key(sorted[i-1])) {
			again = append(again, c)
			continue
		}
		distinct = append(distinct, c)
	}
	if len(distinct) == 1 {
		alone(distinct[0])
	} else if err := together(distinct); err != nil {
		for _, c := range distinct {
			alone(c)
		}
	}
	for _, c := range again {
		alone(c)
	}
}

// together returns what st, rendered for len(calls) calls, runs with
// for calls together: the context, until the latest of their deadlines
// (cancel it after), and the arguments, each call's from its params (of
// returns a call's context and params).
func together[C any](st statement, calls []C, of func(C) (context.Context, *params)) (context.Context, context.CancelFunc, []any) {
	ctxs := make([]context.Context, len(calls))
	ps := make([]*params, len(calls))
	for i, c := range calls {
		ctxs[i], ps[i] = of(c)
	}
	ctx, cancel := storekit.BatchContext(ctxs...)
	return ctx, cancel, st.argsOf(ps)
}

// firstAlone runs "acquire first" for c alone.
func (s *Store) firstAlone(c *acquireCall) {
	first := s.sql.acquireFirst[1]
	st, err := s.stmt(c.ctx, first.sql)
	if err != nil {
		c.err = err
		return
	}
	var key []byte
	c.err = c.row.scanFirst(st.QueryRowContext(c.ctx, first.args(c.p)...), &key)
}

// firstTogether runs "acquire first" for calls, of distinct keys, as one
// statement, until the latest of their deadlines, and leaves each call
// its row; it fails if a row does not come back, in order.
func (s *Store) firstTogether(calls []*acquireCall) error {
	first := s.sql.acquireFirst[len(calls)]
	ctx, cancel, args := together(first, calls, func(c *acquireCall) (context.Context, *params) { return c.ctx, c.p })
	defer cancel()
	st, err := s.stmt(ctx, first.sql)
	if err != nil {
		return err
	}
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var key []byte
	for _, c := range calls {
		if !rows.Next() {
			return fmt.Errorf("acquire first: %d rows back for %d calls", slices.Index(calls, c), len(calls))
		}
		if err := c.row.scanFirst(rows, &key); err != nil {
			return err
		}
		if !bytes.Equal(key, c.p.key) {
			return fmt.Errorf("acquire first: a row of another key back")
		}
	}
	if rows.Next() {
		return fmt.Errorf("acquire first: more rows back than calls")
	}
	return rows.Err()
}

// maxTogetherOutput bounds the output of a completion sent with others: a
// larger one goes alone, so that a statement of maxBatch completions
// stays far below the server's max_allowed_packet.
const maxTogetherOutput = 64 << 10

// completeCall is one Complete: the error it met, or none.
type completeCall struct {
	ctx   context.Context
	lease backends.Lease
	p     params // key, owner, token, output
	err   error
}

// sendCompletes runs Complete for calls (see send); a failed statement
// wrote nothing.
func (s *Store) sendCompletes(calls []*completeCall) {
	send(calls, func(c *completeCall) []byte { return c.p.key }, s.completeAlone, s.completeTogether)
}

// completeAlone runs Complete for c alone.
func (s *Store) completeAlone(c *completeCall) {
	c.err = s.held(c.ctx, s.db, "complete", s.sql.complete, c.lease, params{output: c.p.output})
}

// completeTogether runs Complete for calls, of distinct keys, as one
// statement, until the latest of their deadlines. When it changed a row
// for each call, each completed; when fewer, each call whose lease did
// not complete its record ("completed by") lost it. It fails only if the
// statement did, having written nothing.
func (s *Store) completeTogether(calls []*completeCall) error {
	complete := s.sql.completeTogether[len(calls)]
	ctx, cancel, args := together(complete, calls, func(c *completeCall) (context.Context, *params) { return c.ctx, &c.p })
	defer cancel()
	st, err := s.stmt(ctx, complete.sql)
	if err != nil {
		return err
	}
	res, err := st.ExecContext(ctx, args...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err == nil && n == int64(len(calls)) {
		return nil
	}
	for _, c := range calls {
		var one int
		err := s.db.QueryRowContext(c.ctx, s.sql.completedBy.sql, s.sql.completedBy.args(&c.p)...).Scan(&one)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			c.err = backends.ErrLeaseLost
		case err != nil:
			c.err = opError("complete", err)
		}
	}
	return nil
}
