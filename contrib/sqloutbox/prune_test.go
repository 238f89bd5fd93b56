package sqloutbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
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

// TestPruneUnderLoad: Prune, run in a loop with no age and small batches
// while writers commit orders and the Forwarder forwards them, deletes
// every row once it is forwarded and none before: every receipt reaches
// the broker, and the table ends empty.
func TestPruneUnderLoad(t *testing.T) {
	e := newPgEnv(t)
	h := e.outbox.Handler(e.charge(nil))
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	received, err := broker.Subscribe(context.Background(), "receipts")
	if err != nil {
		t.Fatal(err)
	}
	fwd, err := e.outbox.NewForwarder(broker, nil, forwarder.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fwdDone := make(chan error, 1)
	go func() { fwdDone <- fwd.Run(ctx) }()
	defer func() {
		cancel()
		_ = fwd.Close()
		<-fwdDone
	}()

	if _, err := e.outbox.Prune(ctx, -time.Second, 0); !errors.Is(err, sqloutbox.ErrInvalidOptions) {
		t.Fatalf("a negative age: %v, want ErrInvalidOptions", err)
	}

	const writers, orders = 4, 50
	// The writers go on past their orders until Prune has deleted rows
	// while they write (on MySQL, rows a second old at least), for at
	// most a minute.
	var pruned, written atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for o := 0; o < orders || pruned.Load() == 0 && time.Since(start) < time.Minute; o++ {
				written.Add(1)
				if _, err := e.run(h, fmt.Sprintf("w%d-o%d", w, o)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	pruning := make(chan struct{})
	pruneDone := make(chan error, 1)
	go func() {
		for {
			n, err := e.outbox.Prune(ctx, 0, 7)
			if err != nil {
				pruneDone <- err
				return
			}
			pruned.Add(n)
			select {
			case <-pruning:
				pruneDone <- nil
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()

	got := map[string]int{}
	allWritten := make(chan struct{})
	go func() { wg.Wait(); close(allWritten) }()
	for done := false; !done || int64(len(got)) < written.Load(); {
		wrote := allWritten
		if done {
			wrote = nil
		}
		select {
		case <-wrote:
			done = true
		case m := <-received:
			m.Ack()
			got[m.UUID]++
		case <-time.After(time.Minute):
			t.Fatalf("%d of %d receipts forwarded in a minute of silence", len(got), written.Load())
		}
	}
	close(pruning)
	if err := <-pruneDone; err != nil {
		t.Fatal(err)
	}
	duringLoad := pruned.Load()
	if duringLoad == 0 {
		t.Fatal("nothing was pruned while the writers wrote, in a minute")
	}
	for w := range writers {
		for o := range orders {
			if id := fmt.Sprintf("receipt-w%d-o%d", w, o); got[id] == 0 {
				t.Errorf("%s was never forwarded", id)
			}
		}
	}
	// Once the Forwarder has stored its last offset, a last Prune empties
	// the table; one with an age keeps what is younger.
	deadline := time.Now().Add(time.Minute)
	for {
		backlog, _, err := e.outbox.Backlog(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if backlog == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still in the backlog a minute after the last was received", backlog)
		}
		time.Sleep(10 * time.Millisecond)
	}
	left := e.outboxRows(t)
	if n, err := e.outbox.Prune(context.Background(), time.Hour, 0); err != nil || n != 0 {
		t.Fatalf("Prune of rows older than an hour: %d, %v; want 0, nil", n, err)
	}
	n, err := e.outbox.Prune(context.Background(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if int(n) != left || e.outboxRows(t) != 0 {
		t.Fatalf("the last Prune deleted %d of the %d rows left, and left %d", n, left, e.outboxRows(t))
	}
	t.Logf("%d orders from %d writers: %d rows pruned while they were written and forwarded, %d after; %d receipts forwarded, %d more than once",
		written.Load(), writers, duringLoad, n, len(got), redelivered(got))
}

func redelivered(got map[string]int) int {
	n := 0
	for _, c := range got {
		if c > 1 {
			n++
		}
	}
	return n
}
