package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// listState is what List asks of a record's row for a state of
// [backends.State]: the code of its state column (nil for any), and
// whether its lease must be live (true), run out (false), or either
// (nil), judged by the server's clock as Inspect judges it.
func listState(state backends.State) (code, live any) {
	switch state {
	case backends.StateInProgress:
		return int16(stateInProgress), true
	case backends.StateExpired:
		return int16(stateInProgress), false
	case backends.StateReleased:
		return int16(stateReleased), nil
	case backends.StateCompleted:
		return int16(stateCompleted), nil
	}
	return nil, nil // any; ValidateList refused every other state
}

// List implements [backends.Lister]: keyset pagination on the table's
// primary key, one indexed range scan per page.
func (s *Store) List(ctx context.Context, req backends.ListRequest) (backends.ListPage, error) {
	if err := storekit.ValidateList(req); err != nil {
		return backends.ListPage{}, err
	}
	after, _ := storekit.ParseListCursor(req.Cursor)
	lower, upper := storekit.ListRange(req.Namespace)
	code, live := listState(req.State)
	rows, err := s.pool.Query(ctx, s.sql.list, []byte(after), lower, upper, code, live, req.Limit)
	if err != nil {
		return backends.ListPage{}, opError("list", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (backends.Record, error) { return scanRecord(row) })
	if err != nil {
		return backends.ListPage{}, opError("list", err)
	}
	page := backends.ListPage{Records: recs}
	if len(recs) == req.Limit {
		page.Cursor = storekit.ListCursor(recs[len(recs)-1].Key)
	}
	return page, nil
}

// Count implements [backends.Lister] with one aggregate over the
// namespace's key range.
func (s *Store) Count(ctx context.Context, namespace string) (backends.Counts, error) {
	lower, upper := storekit.ListRange(namespace)
	var c backends.Counts
	var oldest *time.Time // NULL without a lease in progress
	err := s.pool.QueryRow(ctx, s.sql.count, lower, upper).Scan(&c.InProgress, &c.Expired, &c.Released, &c.Completed, &oldest)
	if err != nil {
		return backends.Counts{}, opError("count", err)
	}
	if oldest != nil {
		c.OldestInProgress = *oldest
	}
	return c, nil
}
