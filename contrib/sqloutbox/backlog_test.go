package sqloutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/mysqloutbox"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// backlogger is an outbox with a Backlog and a Forwarder.
type backlogger interface {
	Backlog(ctx context.Context) (int64, time.Duration, error)
	NewForwarder(out message.Publisher, logger watermill.LoggerAdapter, cfg forwarder.Config) (*forwarder.Forwarder, error)
}

// checkBacklog writes two orders through the outbox (run), ages the first
// row by an hour (age), forwards them, and writes a third: the backlog counts
// what the Forwarder has not passed, and its oldest.
func checkBacklog(t *testing.T, ob backlogger, run func(order string), age func()) {
	t.Helper()
	ctx := context.Background()
	backlog := func() (int64, time.Duration) {
		t.Helper()
		n, oldest, err := ob.Backlog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n, oldest
	}
	if n, oldest := backlog(); n != 0 || oldest != 0 {
		t.Fatalf("empty outbox: backlog %d, oldest %v; want 0, 0", n, oldest)
	}
	run("o1")
	run("o2")
	age()
	if n, oldest := backlog(); n != 2 || oldest < time.Hour {
		t.Fatalf("backlog %d, oldest %v; want 2, the oldest an hour or more", n, oldest)
	}

	broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	received, err := broker.Subscribe(ctx, "receipts")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range received {
			m.Ack()
		}
	}()
	fwd, err := ob.NewForwarder(broker, nil, forwarder.Config{})
	if err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- fwd.Run(fctx) }()
	deadline := time.Now().Add(time.Minute)
	for {
		n, oldest := backlog()
		if n == 0 {
			if oldest != 0 {
				t.Fatalf("no backlog, but the oldest waited %v", oldest)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backlog still %d after a minute of forwarding", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	_ = fwd.Close()
	<-done
	_ = broker.Close()

	run("o3")
	if n, oldest := backlog(); n != 1 || oldest >= time.Hour {
		t.Fatalf("backlog %d, oldest %v; want the one new message", n, oldest)
	}
}

func TestBacklogPostgres(t *testing.T) {
	e := newPgEnv(t)
	h := e.outbox.Handler(e.charge(nil))
	checkBacklog(t, e.outbox, func(order string) {
		if _, err := e.run(h, order); err != nil {
			t.Fatal(err)
		}
	}, func() {
		if _, err := e.pool.Exec(context.Background(), `UPDATE "watermill_`+e.topic+`" SET created_at = created_at - interval '1 hour' WHERE "offset" = (SELECT min("offset") FROM "watermill_`+e.topic+`")`); err != nil {
			t.Fatal(err)
		}
	})

	other, err := sqloutbox.NewPostgres(e.pool, e.store, sqloutbox.Options{Topic: e.topic, Schema: wsql.PostgreSQLQueueSchema{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := other.Backlog(context.Background()); !errors.Is(err, sqloutbox.ErrBacklogUnsupported) {
		t.Errorf("Backlog with another schema: %v, want ErrBacklogUnsupported", err)
	}
}

func TestBacklogMySQL(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("mysql", service(t, "MYSQL_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	topic, keys := unique("outbox"), unique("keys")
	store, err := mysqlstore.New(db, mysqlstore.Options{Table: keys})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := mysqloutbox.New(db, store, mysqloutbox.Options{Topic: topic, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+keys+", `watermill_"+topic+"`, `watermill_offsets_"+topic+"`")
	})
	idem, err := idempotency.New(idempotency.Config{Store: store, Key: keyfunc.Metadata("order"), Namespace: "charge"})
	if err != nil {
		t.Fatal(err)
	}
	h := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return nil, ob.Handler(func(tx *mysqloutbox.Tx, msg *message.Message) error {
			return tx.Publish("receipts", message.NewMessage("receipt-"+msg.Metadata.Get("order"), nil))
		})(msg)
	})
	checkBacklog(t, ob, func(order string) {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set("order", order)
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
	}, func() {
		if _, err := db.ExecContext(ctx, "UPDATE `watermill_"+topic+"` SET created_at = created_at - INTERVAL 1 HOUR ORDER BY `offset` LIMIT 1"); err != nil {
			t.Fatal(err)
		}
	})

	other, err := mysqloutbox.New(db, store, mysqloutbox.Options{Topic: topic, Schema: wsql.DefaultMySQLSchema{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := other.Backlog(ctx); !errors.Is(err, mysqloutbox.ErrBacklogUnsupported) {
		t.Errorf("Backlog with another schema: %v, want ErrBacklogUnsupported", err)
	}
}
