package mysqlstore

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// maxBatch bounds the Acquire calls sent in one statement. MariaDB's cost
// per call falls from about 170 µs of CPU alone to about 55 in a
// statement of four and 25 in one of sixteen (docs/benchmarks.md).
const maxBatch = 16

// firstBatch is "acquire first" for batches of calls: its SQL for n of
// them, one row of values each ("acquire row"), and the parameters of one
// row.
type firstBatch struct {
	sql   [maxBatch + 1]string // by the number of calls; sql[0] is unused
	names []string
}

// newFirstBatch makes the firstBatch of first, whose only parameters are
// those of its one row of values, row.
func newFirstBatch(first, row statement) (firstBatch, error) {
	head, tail, ok := strings.Cut(first.sql, row.sql)
	if !ok || strings.Contains(tail, row.sql) || !slices.Equal(first.names, row.names) {
		return firstBatch{}, fmt.Errorf("acquire first: not one row of values and no other parameters")
	}
	fb := firstBatch{names: row.names}
	for n := 1; n <= maxBatch; n++ {
		rows := make([]string, n)
		for i := range rows {
			rows[i] = row.sql
		}
		fb.sql[n] = head + strings.Join(rows, ",\n    ") + tail
	}
	return fb, nil
}

// acquireCall is one Acquire's first statement: the row it left, or the
// error it met.
type acquireCall struct {
	ctx context.Context
	p   *params
	row acquired
	err error
}

// sendFirst runs "acquire first" for calls: alone, with its own context,
// if there is one; else as one statement for those with distinct keys,
// in key order, so that two batches never wait for each other's rows in a
// cycle, and then, alone, each call whose key came earlier in the batch,
// so that it sees that call's row as a call after it would. If the
// statement fails, or its rows do not come back one per call in order,
// each call runs again alone, so that one call's error is never
// another's: a failed statement wrote nothing, and a row it did insert
// reads again as its owner's own lease, which the upsert gives back to it.
func (s *Store) sendFirst(calls []*acquireCall) {
	if len(calls) == 1 {
		s.firstAlone(calls[0])
		return
	}
	sorted := slices.Clone(calls)
	slices.SortStableFunc(sorted, func(x, y *acquireCall) int { return bytes.Compare(x.p.key, y.p.key) })
	distinct, again := sorted[:0:0], []*acquireCall(nil)
	for i, c := range sorted {
		if i > 0 && bytes.Equal(c.p.key, sorted[i-1].p.key) {
			again = append(again, c)
			continue
		}
		distinct = append(distinct, c)
	}
	if len(distinct) == 1 {
		s.firstAlone(distinct[0])
	} else if err := s.firstTogether(distinct); err != nil {
		for _, c := range distinct {
			s.firstAlone(c)
		}
	}
	for _, c := range again {
		s.firstAlone(c)
	}
}

// firstAlone runs "acquire first" for c alone.
func (s *Store) firstAlone(c *acquireCall) {
	st, err := s.stmt(c.ctx, s.sql.firstBatch.sql[1])
	if err != nil {
		c.err = err
		return
	}
	var key []byte
	c.err = c.row.scanFirst(st.QueryRowContext(c.ctx, s.sql.acquireFirst.args(c.p)...), &key)
}

// firstTogether runs "acquire first" for calls, of distinct keys, as one
// statement, until the latest of their deadlines, and leaves each call
// its row; it fails if a row does not come back, in order.
func (s *Store) firstTogether(calls []*acquireCall) error {
	ctxs := make([]context.Context, len(calls))
	args := make([]any, 0, len(calls)*len(s.sql.firstBatch.names))
	for i, c := range calls {
		ctxs[i] = c.ctx
		args = append(args, s.sql.acquireFirst.args(c.p)...)
	}
	ctx, cancel := storekit.BatchContext(ctxs...)
	defer cancel()
	st, err := s.stmt(ctx, s.sql.firstBatch.sql[len(calls)])
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
