package sqloutbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// pgEnv is an outbox on Postgres with a store, a business table and the
// middleware, each under names of its own.
type pgEnv struct {
	pool    *pgxpool.Pool
	store   *pgstore.Store
	outbox  *sqloutbox.Postgres
	idem    *idempotency.Idempotency
	topic   string
	charges string
	// leaked is set by a test that saw a transaction left open: its locks
	// would block the cleanup's DROP TABLE, and closing the pool would
	// wait for its connection, forever.
	leaked atomic.Bool
}

func newPgEnv(t *testing.T) *pgEnv {
	t.Helper()
	return newPgEnvAt(t, service(t, "TEST_DATABASE_URL"))
}

// newPgEnvAt is newPgEnv on the Postgres of url.
func newPgEnvAt(t *testing.T, url string) *pgEnv {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	e := &pgEnv{pool: pool, topic: unique("outbox"), charges: unique("charges")}
	t.Cleanup(func() {
		if !e.leaked.Load() {
			pool.Close()
		}
	})
	keys := unique("keys")
	if e.store, err = pgstore.New(pool, pgstore.Options{Table: keys}); err != nil {
		t.Fatal(err)
	}
	if e.outbox, err = sqloutbox.NewPostgres(pool, e.store, sqloutbox.Options{Topic: e.topic, PollInterval: 10 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.outbox.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+e.charges+` (order_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if e.leaked.Load() {
			return
		}
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+e.charges+`, `+keys+`, "watermill_`+e.topic+`", "watermill_offsets_`+e.topic+`"`)
	})
	if e.idem, err = idempotency.New(idempotency.Config{Store: e.store, Key: keyfunc.Metadata("order"), Namespace: "charge"}); err != nil {
		t.Fatal(err)
	}
	return e
}

// charge is the handler: a charge row and a receipt, through the outbox.
func (e *pgEnv) charge(fail error) sqloutbox.PgxHandlerFunc {
	return func(tx *sqloutbox.PgxTx, msg *message.Message) error {
		order := msg.Metadata.Get("order")
		if _, err := tx.Exec(msg.Context(), `INSERT INTO `+e.charges+` VALUES ($1)`, order); err != nil {
			return err
		}
		if err := tx.Publish("receipts", message.NewMessage("receipt-"+order, []byte(order))); err != nil {
			return err
		}
		return fail
	}
}

// run runs h under the middleware for a delivery of order.
func (e *pgEnv) run(h message.NoPublishHandlerFunc, order string) ([]*message.Message, error) {
	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set("order", order)
	return e.idem.Middleware(func(m *message.Message) ([]*message.Message, error) { return nil, h(m) })(msg)
}

func (e *pgEnv) count(t *testing.T, sql string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *pgEnv) outboxRows(t *testing.T) int {
	return e.count(t, `SELECT count(*) FROM "watermill_`+e.topic+`"`)
}

func (e *pgEnv) chargeRows(t *testing.T) int {
	return e.count(t, `SELECT count(*) FROM `+e.charges)
}

func TestDuplicateOfACompletedKeyPublishesNothing(t *testing.T) {
	e := newPgEnv(t)
	h := e.outbox.Handler(e.charge(nil))
	for i := range 3 {
		out, err := e.run(h, "o1")
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
		if len(out) != 0 {
			t.Fatalf("delivery %d: %d messages returned for the router to publish, want none", i, len(out))
		}
	}
	if n := e.chargeRows(t); n != 1 {
		t.Errorf("%d charge rows, want 1", n)
	}
	if n := e.outboxRows(t); n != 1 {
		t.Errorf("%d outbox rows, want 1", n)
	}
	rec, err := e.store.Inspect(context.Background(), "charge:o1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != backends.StateCompleted || len(rec.Output) != 0 {
		t.Errorf("record %v with %d bytes of output, want completed with none to replay", rec.State, len(rec.Output))
	}
	// The envelope names the destination and keeps the message's UUID.
	var payload string
	if err := e.pool.QueryRow(context.Background(), `SELECT payload::text FROM "watermill_`+e.topic+`"`).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	var env struct {
		DestinationTopic string `json:"destination_topic"`
		UUID             string `json:"uuid"`
	}
	if err := json.Unmarshal([]byte(payload), &env); err != nil {
		t.Fatal(err)
	}
	if env.DestinationTopic != "receipts" || env.UUID != "receipt-o1" {
		t.Errorf("envelope %+v, want receipt-o1 bound for receipts", env)
	}
}

func TestHandlerErrorRecordsNothing(t *testing.T) {
	e := newPgEnv(t)
	boom := errors.New("boom")
	if _, err := e.run(e.outbox.Handler(e.charge(boom)), "o1"); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the handler's error", err)
	}
	if c, o := e.chargeRows(t), e.outboxRows(t); c != 0 || o != 0 {
		t.Fatalf("after a failed handler: %d charge rows, %d outbox rows, want none", c, o)
	}
	// The redelivery runs again and records once.
	if _, err := e.run(e.outbox.Handler(e.charge(nil)), "o1"); err != nil {
		t.Fatal(err)
	}
	if c, o := e.chargeRows(t), e.outboxRows(t); c != 1 || o != 1 {
		t.Fatalf("after the redelivery: %d charge rows, %d outbox rows, want 1 and 1", c, o)
	}
}

// A lease lost before the commit (here: the key deleted by an operator
// while the handler ran) rolls the whole transaction back.
func TestLostLeaseRecordsNothing(t *testing.T) {
	e := newPgEnv(t)
	h := e.outbox.Handler(func(tx *sqloutbox.PgxTx, msg *message.Message) error {
		if err := e.charge(nil)(tx, msg); err != nil {
			return err
		}
		return e.store.Delete(context.Background(), "charge:o1")
	})
	if _, err := e.run(h, "o1"); !errors.Is(err, backends.ErrLeaseLost) {
		t.Fatalf("got %v, want ErrLeaseLost", err)
	}
	if c, o := e.chargeRows(t), e.outboxRows(t); c != 0 || o != 0 {
		t.Fatalf("%d charge rows, %d outbox rows, want none", c, o)
	}
}

func TestHandlerNeedsTheMiddleware(t *testing.T) {
	e := newPgEnv(t)
	err := e.outbox.Handler(e.charge(nil))(message.NewMessage("m1", nil))
	if !errors.Is(err, sqloutbox.ErrNoLease) {
		t.Fatalf("got %v, want ErrNoLease", err)
	}
}

func TestTheOutboxOwnsTheTransaction(t *testing.T) {
	e := newPgEnv(t)
	h := e.outbox.Handler(func(tx *sqloutbox.PgxTx, msg *message.Message) error {
		if err := e.charge(nil)(tx, msg); err != nil {
			return err
		}
		if err := tx.Commit(msg.Context()); !errors.Is(err, sqloutbox.ErrOwnedTx) {
			t.Errorf("Commit: got %v, want ErrOwnedTx", err)
		}
		if err := tx.Rollback(msg.Context()); !errors.Is(err, sqloutbox.ErrOwnedTx) {
			t.Errorf("Rollback: got %v, want ErrOwnedTx", err)
		}
		return nil
	})
	if _, err := e.run(h, "o1"); err != nil {
		t.Fatal(err)
	}
	if c, o := e.chargeRows(t), e.outboxRows(t); c != 1 || o != 1 {
		t.Fatalf("%d charge rows, %d outbox rows, want 1 and 1", c, o)
	}
}

// The Forwarder moves each message to its destination with its own UUID,
// metadata and payload.
func TestForwarderPublishesToTheDestination(t *testing.T) {
	e := newPgEnv(t)
	h := e.outbox.Handler(func(tx *sqloutbox.PgxTx, msg *message.Message) error {
		m := message.NewMessage("receipt-"+msg.Metadata.Get("order"), []byte(`{"amount":5}`))
		m.Metadata.Set("trace", "t1")
		return tx.Publish("receipts", m)
	})
	if _, err := e.run(h, "o1"); err != nil {
		t.Fatal(err)
	}
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
	done := make(chan error, 1)
	go func() { done <- fwd.Run(ctx) }()
	defer func() {
		cancel()
		_ = fwd.Close()
		<-done
	}()
	select {
	case m := <-received:
		m.Ack()
		if m.UUID != "receipt-o1" || string(m.Payload) != `{"amount":5}` || m.Metadata.Get("trace") != "t1" {
			t.Errorf("forwarded %s %q %v", m.UUID, m.Payload, m.Metadata)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("nothing forwarded in 30 s")
	}
}

func TestOptions(t *testing.T) {
	e := newPgEnv(t)
	// A nil pool is a nil client, as for every store's constructor, and
	// still invalid options; a nil store is invalid options only.
	for name, db := range map[string]sqloutbox.PgxDB{"nil pool": nil, "typed nil pool": (*pgxpool.Pool)(nil)} {
		_, err := sqloutbox.NewPostgres(db, e.store, sqloutbox.Options{})
		if !errors.Is(err, backends.ErrNilClient) || !errors.Is(err, sqloutbox.ErrInvalidOptions) {
			t.Errorf("%s: got %v, want ErrNilClient and ErrInvalidOptions", name, err)
		}
	}
	if _, err := sqloutbox.NewPostgres(e.pool, nil, sqloutbox.Options{}); !errors.Is(err, sqloutbox.ErrInvalidOptions) || errors.Is(err, backends.ErrNilClient) {
		t.Errorf("nil store: got %v, want ErrInvalidOptions only", err)
	}
	if _, err := sqloutbox.NewPostgres(e.pool, e.store, sqloutbox.Options{PollInterval: -1}); !errors.Is(err, sqloutbox.ErrInvalidOptions) {
		t.Errorf("negative PollInterval: got %v", err)
	}
	if _, err := sqloutbox.NewPostgres(e.pool, e.store, sqloutbox.Options{Retention: -1}); !errors.Is(err, sqloutbox.ErrInvalidOptions) {
		t.Errorf("negative Retention: got %v", err)
	}
	_, err := sqloutbox.NewPostgres(e.pool, e.store, sqloutbox.Options{Retention: time.Hour, Schema: wsql.PostgreSQLQueueSchema{}})
	if !errors.Is(err, sqloutbox.ErrInvalidOptions) || !errors.Is(err, sqloutbox.ErrPruneUnsupported) {
		t.Errorf("Retention with a schema Prune cannot read: got %v", err)
	}
	broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	if _, err := e.outbox.NewForwarder(broker, nil, forwarder.Config{ForwarderTopic: "other"}); !errors.Is(err, sqloutbox.ErrInvalidOptions) {
		t.Errorf("another forwarder topic: got %v", err)
	}
	if _, err := e.outbox.NewForwarder(nil, nil, forwarder.Config{}); !errors.Is(err, sqloutbox.ErrInvalidOptions) {
		t.Errorf("nil publisher: got %v", err)
	}
}
