package outbox

import (
	"database/sql"
	"reflect"
	"testing"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// The Forwarder marks forwarded the rows of a batch up to the last it
// forwarded, not the rest; and it reads at READ COMMITTED.
func TestQueueOffsetsMarkTheRowsForwarded(t *testing.T) {
	schema, _ := forwarderAdapters(wsql.MySQLQueueSchema{}, wsql.MySQLQueueOffsetsAdapter{})
	if got := schema.SubscribeIsolationLevel(); got != sql.LevelReadCommitted {
		t.Errorf("isolation %v, want READ COMMITTED", got)
	}
	rows := []wsql.Row{{Offset: 11}, {Offset: 12}, {Offset: 13}, {Offset: 14}, {Offset: 15}}
	for _, deleteOnAck := range []bool{false, true} {
		_, offsets := forwarderAdapters(wsql.MySQLQueueSchema{}, wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: deleteOnAck})
		q, err := offsets.AckMessageQuery(wsql.AckMessageQueryParams{Topic: "t", LastRow: rows[1], Rows: rows})
		if err != nil {
			t.Fatal(err)
		}
		if want := []any{int64(11), int64(12)}; !reflect.DeepEqual(q.Args, want) {
			t.Errorf("DeleteOnAck %v: %s with %v, want the offsets %v", deleteOnAck, q.Query, q.Args, want)
		}
	}
	// Other adapters are the outbox's own.
	s, o := forwarderAdapters(wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{})
	if _, ok := s.(wsql.DefaultPostgreSQLSchema); !ok {
		t.Errorf("Postgres schema became %T", s)
	}
	if _, ok := o.(wsql.DefaultPostgreSQLOffsetsAdapter); !ok {
		t.Errorf("Postgres offsets became %T", o)
	}
}
