package mysqlstore

import (
	"context"
	"database/sql"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// stateFilter keeps the rows in the state of its two parameters (a
// backends.State; 0 for any), judged by the server's clock as Inspect
// judges them.
const stateFilter = `CASE ? WHEN 0 THEN TRUE
	WHEN 1 THEN state = 1 AND lease_expires_us > ` + now + `
	WHEN 2 THEN state = 1 AND lease_expires_us <= ` + now + `
	WHEN 3 THEN state = 2
	ELSE state = 3 END`

// List implements [backends.Lister]: keyset pagination on the table's
// primary key, one range scan per page.
func (s *Store) List(ctx context.Context, req backends.ListRequest) (backends.ListPage, error) {
	if err := storekit.ValidateList(req); err != nil {
		return backends.ListPage{}, err
	}
	after, _ := storekit.ParseListCursor(req.Cursor)
	lower, upper := storekit.ListRange(req.Namespace)
	rows, err := s.db.QueryContext(ctx, s.sql.list, []byte(after), lower, nullable(upper), nullable(upper), int(req.State), req.Limit)
	if err != nil {
		return backends.ListPage{}, opError("list", err)
	}
	defer rows.Close()
	var page backends.ListPage
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return backends.ListPage{}, opError("list", err)
		}
		page.Records = append(page.Records, rec)
	}
	if err := rows.Err(); err != nil {
		return backends.ListPage{}, opError("list", err)
	}
	if len(page.Records) == req.Limit {
		page.Cursor = storekit.ListCursor(page.Records[len(page.Records)-1].Key)
	}
	return page, nil
}

// Count implements [backends.Lister] with one aggregate over the
// namespace's key range.
func (s *Store) Count(ctx context.Context, namespace string) (backends.Counts, error) {
	lower, upper := storekit.ListRange(namespace)
	var c backends.Counts
	var oldest sql.NullInt64 // NULL without a lease in progress
	err := s.db.QueryRowContext(ctx, s.sql.count, lower, nullable(upper), nullable(upper)).Scan(&c.InProgress, &c.Expired, &c.Released, &c.Completed, &oldest)
	if err != nil {
		return backends.Counts{}, opError("count", err)
	}
	if oldest.Valid {
		c.OldestInProgress = micros(oldest.Int64)
	}
	return c, nil
}

// nullable is b, or SQL NULL for nil.
func nullable(b []byte) any {
	if b == nil {
		return nil
	}
	return b
}
