package sqloutbox_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// The retention statement of docs/outbox.md deletes the rows the Forwarder
// has passed, and only those.
func TestPruneAsDocumented(t *testing.T) {
	e := newPgEnv(t)
	h := e.outbox.Handler(e.charge(nil))
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	received, err := broker.Subscribe(context.Background(), "receipts")
	if err != nil {
		t.Fatal(err)
	}
	forward := func(orders ...string) {
		t.Helper()
		fwd, err := e.outbox.NewForwarder(broker, nil, forwarder.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- fwd.Run(ctx) }()
		defer func() {
			cancel()
			_ = fwd.Close()
			<-done
		}()
		// The Forwarder publishes in the outbox's order, but the Go
		// channel delivers each message from a goroutine of its own: they
		// may arrive in either order.
		want := map[string]bool{}
		for _, o := range orders {
			want["receipt-"+o] = true
		}
		for range orders {
			select {
			case m := <-received:
				m.Ack()
				if !want[m.UUID] {
					t.Fatalf("forwarded %s, want one of %v", m.UUID, want)
				}
				delete(want, m.UUID)
			case <-time.After(30 * time.Second):
				t.Fatalf("%v not forwarded in 30 s", want)
			}
		}
		// The offset is stored when the batch's transaction commits,
		// after the last ack: close the Forwarder only then.
		deadline := time.Now().Add(30 * time.Second)
		for e.count(t, `SELECT count(*) FROM "watermill_offsets_`+e.topic+`" WHERE offset_acked > 0`) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the Forwarder stored no offset in 30 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, o := range []string{"o1", "o2"} {
		if _, err := e.run(h, o); err != nil {
			t.Fatal(err)
		}
	}
	forward("o1", "o2")
	if _, err := e.run(h, "o3"); err != nil { // not forwarded yet
		t.Fatal(err)
	}

	b, err := os.ReadFile("testdata/prune_postgres.sql")
	if err != nil {
		t.Fatal(err)
	}
	stmt := strings.NewReplacer(
		"watermill_offsets_outbox", `"watermill_offsets_`+e.topic+`"`,
		"watermill_outbox", `"watermill_`+e.topic+`"`,
		"interval '7 days'", "interval '0 seconds'",
	).Replace(string(b))
	tag, err := e.pool.Exec(context.Background(), stmt)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 2 {
		t.Errorf("pruned %d rows, want the 2 forwarded", tag.RowsAffected())
	}
	if n := e.outboxRows(t); n != 1 {
		t.Fatalf("%d rows left, want the one not forwarded", n)
	}
	forward("o3")
}
