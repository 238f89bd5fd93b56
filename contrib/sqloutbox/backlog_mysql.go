package sqloutbox

import (
	"context"
	"fmt"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// Backlog returns how many messages wait in the outbox for the Forwarder
// (rows not marked forwarded), and how long the oldest of them has
// waited, by the database's clock (zero if none does). It scans the
// outbox table, as each read of the Forwarder does: prune forwarded rows
// (docs/outbox.md) or delete them as they are forwarded to keep both
// short. It implements contrib/otel's OutboxBacklog, for the outbox
// gauges.
//
// It returns [ErrBacklogUnsupported] unless Options.Schema and
// Options.Offsets are the defaults.
func (m *MySQL) Backlog(ctx context.Context) (messages int64, oldest time.Duration, err error) {
	schema, ok1 := m.opts.Schema.(wsql.MySQLQueueSchema)
	_, ok2 := m.opts.Offsets.(wsql.MySQLQueueOffsetsAdapter)
	if !ok1 || !ok2 {
		return 0, 0, ErrBacklogUnsupported
	}
	q := "SELECT COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), CURRENT_TIMESTAMP), 0) FROM " +
		schema.MessagesTable(m.opts.Topic) + " WHERE NOT acked"
	var micros int64
	if err := m.sqldb.QueryRowContext(ctx, q).Scan(&messages, &micros); err != nil {
		return 0, 0, fmt.Errorf("sqloutbox: backlog: %w", err)
	}
	return messages, time.Duration(max(0, micros)) * time.Microsecond, nil
}
