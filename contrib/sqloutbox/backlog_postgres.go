package sqloutbox

import (
	"context"
	"fmt"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// Backlog returns how many messages wait in the outbox for the Forwarder
// (committed, and past the offset its consumer group stored), and how long
// the oldest of them has waited, by the database's clock (zero if none
// does). It is one range scan of the outbox table's primary key over the
// rows not yet forwarded. It implements contrib/otel's OutboxBacklog, for
// the outbox gauges.
//
// It returns [ErrBacklogUnsupported] unless Options.Schema and
// Options.Offsets are the defaults.
func (p *Postgres) Backlog(ctx context.Context) (messages int64, oldest time.Duration, err error) {
	schema, ok1 := p.opts.Schema.(wsql.DefaultPostgreSQLSchema)
	offsets, ok2 := p.opts.Offsets.(wsql.DefaultPostgreSQLOffsetsAdapter)
	if !ok1 || !ok2 {
		return 0, 0, ErrBacklogUnsupported
	}
	// The rows after the stored offset, in the order the Forwarder reads
	// them: (transaction_id, offset), its primary key. created_at is a
	// timestamp without time zone, written as LOCALTIMESTAMP is read.
	q := `SELECT count(*), coalesce(extract(epoch FROM LOCALTIMESTAMP - min(m.created_at)), 0)::float8
FROM ` + schema.MessagesTable(p.opts.Topic) + ` m
WHERE (m.transaction_id, m."offset") > (
	coalesce((SELECT last_processed_transaction_id FROM ` + offsets.MessagesOffsetsTable(p.opts.Topic) + ` WHERE consumer_group = ''), '0'::xid8),
	coalesce((SELECT offset_acked FROM ` + offsets.MessagesOffsetsTable(p.opts.Topic) + ` WHERE consumer_group = ''), 0))`
	rows, err := p.conn.Query(ctx, q)
	if err != nil {
		return 0, 0, fmt.Errorf("sqloutbox: backlog: %w", err)
	}
	defer rows.Close()
	var secs float64
	if rows.Next() {
		err = rows.Scan(&messages, &secs)
	}
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("sqloutbox: backlog: %w", err)
	}
	return messages, time.Duration(max(0, secs) * float64(time.Second)), nil
}
