package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// ErrBacklogUnsupported is returned by Backlog for an outbox whose Schema
// or Offsets is not its database's default, whose tables it cannot read.
var ErrBacklogUnsupported = errors.New("sqloutbox: Backlog reads the tables of the default Schema and Offsets only")

// Backlog returns how many messages wait in the outbox for the Forwarder,
// and how long the oldest of them has waited, by the database's clock
// (zero if none does).
//
// On Postgres (the default schema and offsets) it counts the committed
// rows past the offset the Forwarder's consumer group stored, in the
// order it reads them: one range scan of the primary key (transaction_id,
// offset). On MySQL (the queue schema) it counts the rows not marked
// forwarded: a scan of the table, as each read of the Forwarder is.
func (o *Outbox) Backlog(ctx context.Context) (messages int64, oldest time.Duration, err error) {
	var q string
	var unit time.Duration
	switch schema := o.cfg.Schema.(type) {
	case wsql.DefaultPostgreSQLSchema:
		offsets, ok := o.cfg.Offsets.(wsql.DefaultPostgreSQLOffsetsAdapter)
		if !ok {
			return 0, 0, ErrBacklogUnsupported
		}
		// created_at is a timestamp without time zone, written as
		// LOCALTIMESTAMP is read.
		stored := offsets.MessagesOffsetsTable(o.cfg.Topic)
		q = `SELECT count(*), coalesce(extract(epoch FROM LOCALTIMESTAMP - min(m.created_at)) * 1000000, 0)::bigint
FROM ` + schema.MessagesTable(o.cfg.Topic) + ` m
WHERE (m.transaction_id, m."offset") > (
	coalesce((SELECT last_processed_transaction_id FROM ` + stored + ` WHERE consumer_group = ''), '0'::xid8),
	coalesce((SELECT offset_acked FROM ` + stored + ` WHERE consumer_group = ''), 0))`
		unit = time.Microsecond
	case wsql.MySQLQueueSchema:
		if _, ok := o.cfg.Offsets.(wsql.MySQLQueueOffsetsAdapter); !ok {
			return 0, 0, ErrBacklogUnsupported
		}
		q = "SELECT COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), CURRENT_TIMESTAMP), 0) FROM " +
			schema.MessagesTable(o.cfg.Topic) + " WHERE NOT acked"
		unit = time.Microsecond
	default:
		return 0, 0, ErrBacklogUnsupported
	}
	rows, err := o.db.QueryContext(ctx, q)
	if err != nil {
		return 0, 0, fmt.Errorf("sqloutbox: backlog: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var age int64
	if rows.Next() {
		err = rows.Scan(&messages, &age)
	} else {
		err = errors.New("no row")
	}
	if e, ok := rows.(interface{ Err() error }); ok && err == nil {
		err = e.Err()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("sqloutbox: backlog: %w", err)
	}
	return messages, time.Duration(max(0, age)) * unit, nil
}
