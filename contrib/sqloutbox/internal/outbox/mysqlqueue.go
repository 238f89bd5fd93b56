package outbox

import (
	"database/sql"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// The Forwarder reads a MySQL outbox (watermill-sql's MySQLQueueSchema and
// MySQLQueueOffsetsAdapter) with two changes, both for its subscriber
// only:
//
//   - It marks forwarded only the rows of a batch that were forwarded.
//     watermill-sql v4.1.2 passes the adapter every row the batch read, and
//     the adapter marks them all, so that a batch cut short (the Forwarder
//     stopping, a publish past its ack deadline) would leave its unsent
//     rows marked and never forwarded. The subscriber forwards a batch's
//     rows in order and stops at the first that fails: the rows forwarded
//     are those up to the last one it names.
//   - It reads at READ COMMITTED, not SERIALIZABLE. SERIALIZABLE makes its
//     SELECT ... FOR UPDATE lock every row it scans and the gaps between
//     them, the end of the table included, for the whole batch: every
//     writer's INSERT into the outbox waits for the batch to be published.
//     At READ COMMITTED it locks the unforwarded rows it returns, nothing
//     else. Nothing is lost: a row is forwarded when it is not marked,
//     whatever its offset, so a transaction that commits late is read by
//     a later batch; and a second Forwarder that reaches a locked row
//     waits for it and reads it as committed, marked, and passes it.

// queueSchema is MySQLQueueSchema read at READ COMMITTED.
type queueSchema struct{ wsql.MySQLQueueSchema }

func (queueSchema) SubscribeIsolationLevel() sql.IsolationLevel { return sql.LevelReadCommitted }

// queueOffsets is MySQLQueueOffsetsAdapter marking the rows forwarded only.
type queueOffsets struct{ wsql.MySQLQueueOffsetsAdapter }

func (a queueOffsets) AckMessageQuery(params wsql.AckMessageQueryParams) (wsql.Query, error) {
	sent := params.Rows[:0:0]
	for _, r := range params.Rows {
		if r.Offset <= params.LastRow.Offset {
			sent = append(sent, r)
		}
	}
	params.Rows = sent
	return a.MySQLQueueOffsetsAdapter.AckMessageQuery(params)
}

// forwarderAdapters are the adapters the Forwarder's subscriber reads the
// outbox with: the outbox's own, or their fixed versions above.
func forwarderAdapters(schema wsql.SchemaAdapter, offsets wsql.OffsetsAdapter) (wsql.SchemaAdapter, wsql.OffsetsAdapter) {
	if q, ok := schema.(wsql.MySQLQueueSchema); ok {
		schema = queueSchema{q}
	}
	if q, ok := offsets.(wsql.MySQLQueueOffsetsAdapter); ok {
		offsets = queueOffsets{q}
	}
	return schema, offsets
}
