package mysqloutbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/mysqloutbox"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// TestPruneUnderLoad: Prune, run in a loop with no age and small batches
// while writers commit orders through Do and WithTx and the Forwarder
// forwards them, deletes only forwarded rows: every receipt reaches the
// broker, and the table ends empty.
func TestPruneUnderLoad(t *testing.T) {
	e := newMyEnv(t)
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
	if _, err := e.outbox.Prune(ctx, -time.Second, 0); !errors.Is(err, mysqloutbox.ErrInvalidOptions) {
		t.Fatalf("a negative age: %v, want ErrInvalidOptions", err)
	}

	const writers, orders = 4, 30
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
				order := fmt.Sprintf("w%d-o%d", w, o)
				_, err := idempotency.Do(ctx, e.idem, order, func(ctx context.Context) (struct{}, error) {
					return struct{}{}, e.outbox.WithTx(ctx, func(tx *mysqloutbox.Tx) error {
						if _, err := tx.ExecContext(ctx, `INSERT INTO `+e.charges+` VALUES (?)`, order); err != nil {
							return err
						}
						return tx.Publish("receipts", message.NewMessage("receipt-"+order, nil))
					})
				})
				if err != nil {
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
	_, left := e.count(t)
	if n, err := e.outbox.Prune(context.Background(), time.Hour, 0); err != nil || n != 0 {
		t.Fatalf("Prune of rows older than an hour: %d, %v; want 0, nil", n, err)
	}
	// created_at holds whole seconds: the last rows are old enough for
	// an age of 0 once their second has passed.
	var n int64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		d, err := e.outbox.Prune(context.Background(), 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		n += d
		if _, after := e.count(t); after == 0 || time.Now().After(deadline) {
			break
		}
	}
	if _, after := e.count(t); int(n) != left || after != 0 {
		t.Fatalf("the last Prunes deleted %d of the %d rows left, and left %d", n, left, after)
	}
	t.Logf("%d orders from %d writers: %d rows pruned while they were written and forwarded, %d after; %d receipts forwarded",
		written.Load(), writers, duringLoad, n, len(got))
}
