package mysqlstore

import (
	"context"
	"database/sql"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// listFilter translates a backends.State into what List's statement
// keeps: records whose state column holds state (nil: any), and, for a
// lease in progress, whether it must be live or expired (nil: either),
// judged by the server's clock as Inspect judges it. The zero State keeps
// every record.
func listFilter(s backends.State) (state, live any) {
	switch s {
	case backends.StateInProgress:
		return stateInProgress, true
	case backends.StateExpired:
		return stateInProgress, false
	case backends.StateReleased:
		return stateReleased, nil
	case backends.StateCompleted:
		return stateCompleted, nil
	}
	return nil, nil
}

// List implements [backends.Lister]: keyset pagination on the table's
// primary key, one range scan per page.
func (s *Store) List(ctx context.Context, req backends.ListRequest) (backends.ListPage, error) {
	if err := storekit.ValidateList(req); err != nil {
		return backends.ListPage{}, err
	}
	after, _ := storekit.ParseListCursor(req.Cursor)
	lower, upper := storekit.ListRange(req.Namespace)
	p := params{after: []byte(after), lower: lower, upper: nullable(upper), limit: req.Limit}
	p.state, p.live = listFilter(req.State)
	rows, err := s.db.QueryContext(ctx, s.sql.list.sql, s.sql.list.args(&p)...)
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
	err := s.db.QueryRowContext(ctx, s.sql.count.sql, s.sql.count.args(&params{lower: lower, upper: nullable(upper)})...).Scan(&c.InProgress, &c.Expired, &c.Released, &c.Completed, &oldest)
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
