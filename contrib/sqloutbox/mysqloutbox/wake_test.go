package mysqloutbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/internal/outboxtest"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/mysqloutbox"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// withPoll returns e's outbox with another poll interval.
func (e *myEnv) withPoll(t *testing.T, poll time.Duration) *mysqloutbox.Outbox {
	t.Helper()
	ob, err := mysqloutbox.New(e.db, e.store, mysqloutbox.Options{Topic: e.topic, PollInterval: poll})
	if err != nil {
		t.Fatal(err)
	}
	return ob
}

// publish commits receipts with the given UUIDs for order, through e's
// outbox under Do.
func (e *myEnv) publish(t *testing.T, order string, uuids ...string) {
	t.Helper()
	_, err := idempotency.Do(context.Background(), e.idem, order, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, e.outbox.WithTx(ctx, func(tx *mysqloutbox.Tx) error {
			var msgs []*message.Message
			for _, u := range uuids {
				msgs = append(msgs, message.NewMessage(u, nil))
			}
			return tx.Publish("receipts", msgs...)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// run runs ob's Forwarder, publishing through out, until the returned
// stop.
func run(t *testing.T, ob *mysqloutbox.Outbox, out message.Publisher) (stop func()) {
	t.Helper()
	fwd, err := ob.NewForwarder(out, nil, forwarder.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fwd.Run(ctx) }()
	<-fwd.Running()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			_ = fwd.Close()
			<-done
		})
	}
	t.Cleanup(stop)
	return stop
}

// arrives fails the test unless the receipt named uuid arrives within a
// minute.
func arrives(t *testing.T, received <-chan *message.Message, uuid string) time.Duration {
	t.Helper()
	start := time.Now()
	timeout := time.After(time.Minute)
	for {
		select {
		case m := <-received:
			m.Ack()
			if m.UUID == uuid {
				return time.Since(start)
			}
		case <-timeout:
			t.Fatalf("%s not forwarded in a minute", uuid)
			return 0
		}
	}
}

// A commit of this process wakes its Forwarder, which polls every hour.
func TestForwarderWokenByCommit(t *testing.T) {
	e := newMyEnv(t)
	ob := e.withPoll(t, time.Hour)
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	received, err := broker.Subscribe(context.Background(), "receipts")
	if err != nil {
		t.Fatal(err)
	}
	run(t, ob, broker)
	time.Sleep(time.Second) // past the quick retries after its first read
	for i := range 3 {
		order := fmt.Sprintf("o%d", i)
		e.publish(t, order, "receipt-"+order)
		t.Logf("%s forwarded %v after its commit", order, arrives(t, received, "receipt-"+order))
	}
}

// failing publishes to broker, except the receipts named in fail: for
// those it signals reached and fails.
type failing struct {
	message.Publisher
	fail    map[string]bool
	reached chan struct{}
	once    sync.Once
}

func (f *failing) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if f.fail[m.UUID] {
			f.once.Do(func() { close(f.reached) })
			return errors.New("broker down")
		}
	}
	return f.Publisher.Publish(topic, msgs...)
}

// A batch cut short (the Forwarder stopped while a publish fails) never
// marks forwarded a row it did not forward: the next Forwarder forwards
// them. (TestQueueOffsetsMarkTheRowsForwarded in the internal package
// checks the statement.)
func TestCutBatchMarksOnlyForwardedRows(t *testing.T) {
	e := newMyEnv(t)
	ob := e.outbox
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	received, err := broker.Subscribe(context.Background(), "receipts")
	if err != nil {
		t.Fatal(err)
	}
	e.publish(t, "o1", "r1", "r2", "r3", "r4", "r5") // five rows, one batch
	out := &failing{Publisher: broker, fail: map[string]bool{"r3": true}, reached: make(chan struct{})}
	stop := run(t, ob, out)
	select {
	case <-out.reached:
	case <-time.After(time.Minute):
		t.Fatal("the Forwarder did not reach r3 in a minute")
	}
	stop()
	var marked int
	if err := e.db.QueryRowContext(context.Background(), "SELECT count(*) FROM `watermill_"+e.topic+"` WHERE acked").Scan(&marked); err != nil {
		t.Fatal(err)
	}
	if marked > 2 { // 0 when the stop cut the batch's transaction short
		t.Errorf("%d rows marked forwarded after r1 and r2 were, want at most 2", marked)
	}
	run(t, ob, broker)
	outboxtest.ArriveAll(t, received, "r1", "r2", "r3", "r4", "r5")
}

// With Options.Retention the Forwarder deletes what it forwarded once it
// is older than the retention (whole seconds on MySQL): the table
// empties.
func TestForwarderPrunesWithRetention(t *testing.T) {
	e := newMyEnv(t)
	ob, err := mysqloutbox.New(e.db, e.store, mysqloutbox.Options{Topic: e.topic, Retention: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	received, err := broker.Subscribe(context.Background(), "receipts")
	if err != nil {
		t.Fatal(err)
	}
	run(t, ob, broker)
	e.publish(t, "o1", "r1", "r2", "r3")
	outboxtest.ArriveAll(t, received, "r1", "r2", "r3")
	deadline := time.Now().Add(time.Minute)
	for _, n := e.count(t); n > 0; _, n = e.count(t) {
		if time.Now().After(deadline) {
			t.Fatalf("%d forwarded rows still in the outbox a minute later", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := mysqloutbox.New(e.db, e.store, mysqloutbox.Options{Retention: -1}); !errors.Is(err, mysqloutbox.ErrInvalidOptions) {
		t.Errorf("negative Retention: got %v", err)
	}
}
