package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// ErrPruneUnsupported is returned by Prune for an outbox whose Schema or
// Offsets is not its database's default, whose tables it cannot read.
var ErrPruneUnsupported = errors.New("sqloutbox: Prune deletes from the tables of the default Schema and Offsets only")

// DefaultPruneBatch is the number of rows Prune deletes per statement
// when given none.
const DefaultPruneBatch = 1000

// Prune deletes the rows the Forwarder has passed that are older than
// olderThan, by the database's clock, at most batch rows per statement
// (DefaultPruneBatch if batch is not positive), one statement after
// another until one deletes fewer, and returns how many it deleted. Each
// statement is a transaction of its own that locks only the rows it
// deletes, all behind the Forwarder: writers and the Forwarder go on
// meanwhile. A row the Forwarder has not passed is never deleted.
func (o *Outbox) Prune(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: Prune's age must not be negative, got %v", ErrInvalidOptions, olderThan)
	}
	if batch <= 0 {
		batch = DefaultPruneBatch
	}
	q, err := o.pruneQuery()
	if err != nil {
		return 0, err
	}
	var total int64
	for {
		res, err := o.db.ExecContext(ctx, q, olderThan.Microseconds(), batch)
		if err != nil {
			return total, fmt.Errorf("sqloutbox: prune: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("sqloutbox: prune: %w", err)
		}
		total += n
		if n < int64(batch) {
			return total, nil
		}
	}
}

// pruneQuery is Prune's statement for the outbox's schema, or
// ErrPruneUnsupported.
func (o *Outbox) pruneQuery() (string, error) {
	var q string
	switch schema := o.cfg.Schema.(type) {
	case wsql.DefaultPostgreSQLSchema:
		offsets, ok := o.cfg.Offsets.(wsql.DefaultPostgreSQLOffsetsAdapter)
		if !ok {
			return "", ErrPruneUnsupported
		}
		// The rows at or before the offset the Forwarder's consumer group
		// stored, in its order (transaction_id, offset), as Backlog counts
		// those after it; created_at is written as LOCALTIMESTAMP is read.
		table := schema.MessagesTable(o.cfg.Topic)
		q = `DELETE FROM ` + table + ` WHERE (transaction_id, "offset") IN (
	SELECT m.transaction_id, m."offset" FROM ` + table + ` m, ` + offsets.MessagesOffsetsTable(o.cfg.Topic) + ` s
	WHERE s.consumer_group = ''
	  AND (m.transaction_id, m."offset") <= (s.last_processed_transaction_id, s.offset_acked)
	  AND m.created_at < LOCALTIMESTAMP - $1 * interval '1 microsecond'
	ORDER BY m.transaction_id, m."offset"
	LIMIT $2)`
	case wsql.MySQLQueueSchema:
		if _, ok := o.cfg.Offsets.(wsql.MySQLQueueOffsetsAdapter); !ok {
			return "", ErrPruneUnsupported
		}
		// created_at holds whole seconds: a row counts as old enough
		// once its second, all of it, is.
		q = "DELETE FROM " + schema.MessagesTable(o.cfg.Topic) +
			" WHERE acked AND created_at < CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND - INTERVAL 1 SECOND ORDER BY `offset` LIMIT ?"
	default:
		return "", ErrPruneUnsupported
	}
	return q, nil
}

// pruneLoop deletes, until ctx ends, the forwarded rows older than
// Config.Retention: every Retention, at least every minute and at most
// every second. A failure is logged, once per round at most.
func (o *Outbox) pruneLoop(ctx context.Context, logger watermill.LoggerAdapter) {
	t := time.NewTicker(min(max(o.cfg.Retention, time.Second), time.Minute))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := o.Prune(ctx, o.cfg.Retention, DefaultPruneBatch)
		switch {
		case err != nil && ctx.Err() == nil:
			logger.Error("sqloutbox: pruning the outbox; trying again at the next round", err, watermill.LogFields{"retention": o.cfg.Retention})
		case n > 0:
			logger.Debug("sqloutbox: pruned the outbox", watermill.LogFields{"rows": n, "retention": o.cfg.Retention})
		}
	}
}
