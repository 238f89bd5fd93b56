package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// stateFilter keeps the rows in the state $4 (a backends.State; 0 for
// any), judged by the server's clock as Inspect judges them.
const stateFilter = `CASE $4::int
	WHEN 0 THEN true
	WHEN 1 THEN state = 1 AND lease_expires_at > now()
	WHEN 2 THEN state = 1 AND lease_expires_at <= now()
	WHEN 3 THEN state = 2
	ELSE state = 3 END`

// List implements [backends.Lister]: keyset pagination on the table's
// primary key, one indexed range scan per page.
func (s *Store) List(ctx context.Context, req backends.ListRequest) (backends.ListPage, error) {
	if err := storekit.ValidateList(req); err != nil {
		return backends.ListPage{}, err
	}
	after, _ := storekit.ParseListCursor(req.Cursor)
	lower, upper := storekit.ListRange(req.Namespace)
	rows, err := s.pool.Query(ctx, s.sql.list, []byte(after), lower, upper, int(req.State), req.Limit)
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
