package mysqloutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/internal/outbox"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/mysqloutbox"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// myEnv is an outbox on MariaDB with a store, a business table and the
// middleware for Do, each under names of its own.
type myEnv struct {
	db      *sql.DB
	store   *mysqlstore.Store
	outbox  *mysqloutbox.Outbox
	idem    *idempotency.Idempotency
	topic   string
	charges string
	mu      sync.Mutex
	events  []idempotency.Event
	// leaked is set by a test that saw a transaction left open: its locks
	// would block the cleanup's DROP TABLE for good.
	leaked atomic.Bool
}

func newMyEnv(t *testing.T) *myEnv {
	t.Helper()
	ctx := context.Background()
	db, err := sql.Open("mysql", service(t, "MYSQL_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	e := &myEnv{db: db, topic: unique("outbox"), charges: unique("charges")}
	keys := unique("keys")
	if e.store, err = mysqlstore.New(db, mysqlstore.Options{Table: keys}); err != nil {
		t.Fatal(err)
	}
	if e.outbox, err = mysqloutbox.New(db, e.store, mysqloutbox.Options{Topic: e.topic}); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.outbox.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+e.charges+` (order_id VARCHAR(64) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !e.leaked.Load() {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+e.charges+", "+keys+", `watermill_"+e.topic+"`")
		}
	})
	e.idem, err = idempotency.New(idempotency.Config{Store: e.store, Namespace: "charge",
		Observer: idempotency.ObserverFunc(func(_ context.Context, ev idempotency.Event) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.events = append(e.events, ev)
		})})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// do runs Do on key o1 with a function that writes its charge row and its
// receipt through WithTx, then calls fail in the transaction and returns
// its error.
func (e *myEnv) do(ctx context.Context, runs *atomic.Int32, fail func(tx *mysqloutbox.Tx) error) (string, error) {
	return idempotency.Do(ctx, e.idem, "o1", func(ctx context.Context) (string, error) {
		runs.Add(1)
		err := e.outbox.WithTx(ctx, func(tx *mysqloutbox.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+e.charges+` VALUES (?)`, "o1"); err != nil {
				return err
			}
			if err := tx.Publish("receipts", message.NewMessage("receipt-o1", nil)); err != nil {
				return err
			}
			if fail != nil {
				return fail(tx)
			}
			return nil
		})
		return "charged", err
	})
}

func (e *myEnv) count(t *testing.T) (charges, outboxRows int) {
	t.Helper()
	if err := e.db.QueryRow(`SELECT count(*) FROM ` + e.charges).Scan(&charges); err != nil {
		t.Fatal(err)
	}
	if err := e.db.QueryRow("SELECT count(*) FROM `watermill_" + e.topic + "`").Scan(&outboxRows); err != nil {
		t.Fatal(err)
	}
	return charges, outboxRows
}

func (e *myEnv) state(t *testing.T) backends.State {
	t.Helper()
	rec, err := e.store.Inspect(context.Background(), "charge:o1")
	if err != nil {
		t.Fatal(err)
	}
	return rec.State
}

func (e *myEnv) eventList() []idempotency.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]idempotency.Event(nil), e.events...)
}

// A function run by Do writes its row, its receipt and its key's
// completion in one transaction; Do finds the key completed by its own
// lease and does not complete it again; a duplicate runs nothing.
func TestWithTxUnderDo(t *testing.T) {
	e := newMyEnv(t)
	ctx := context.Background()
	var runs atomic.Int32
	got, err := e.do(ctx, &runs, nil)
	if err != nil || got != "charged" {
		t.Fatalf("Do: %q, %v", got, err)
	}
	if c, o := e.count(t); c != 1 || o != 1 {
		t.Fatalf("%d charge rows, %d outbox rows, want 1 and 1", c, o)
	}
	evs := e.eventList()
	if len(evs) != 1 || evs[0].Outcome != idempotency.OutcomeProcessed || !evs[0].CompletedByHandler {
		t.Fatalf("events %+v, want one OutcomeProcessed with CompletedByHandler: the key completed in the transaction, once", evs)
	}
	if got, err = e.do(ctx, &runs, nil); err != nil || got != "" {
		t.Fatalf("duplicate Do: %q, %v; want the zero value", got, err)
	}
	if runs.Load() != 1 {
		t.Errorf("the function ran %d times, want once", runs.Load())
	}
	if c, o := e.count(t); c != 1 || o != 1 {
		t.Fatalf("after the duplicate: %d charge rows, %d outbox rows, want 1 and 1", c, o)
	}
	if s := e.state(t); s != backends.StateCompleted {
		t.Errorf("the key is %v, want completed", s)
	}
}

// The function fails, or the connection is cut between the completion and
// the commit: nothing is recorded, Do releases the key, and the next call
// runs and records once.
func TestWithTxFailureRecordsNothing(t *testing.T) {
	boom := errors.New("payment declined")
	for name, fail := range map[string]func(e *myEnv) func(*mysqloutbox.Tx) error{
		"function error": func(*myEnv) func(*mysqloutbox.Tx) error {
			return func(*mysqloutbox.Tx) error { return boom }
		},
		"commit fails": func(e *myEnv) func(*mysqloutbox.Tx) error {
			return func(tx *mysqloutbox.Tx) error {
				var id int64
				if err := tx.QueryRow(`SELECT CONNECTION_ID()`).Scan(&id); err != nil {
					return err
				}
				outbox.BeforeCommit = func() {
					outbox.BeforeCommit = func() {}
					if _, err := e.db.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
						panic(err)
					}
				}
				return nil
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newMyEnv(t)
			t.Cleanup(func() { outbox.BeforeCommit = func() {} })
			ctx := context.Background()
			var runs atomic.Int32
			if _, err := e.do(ctx, &runs, fail(e)); err == nil {
				t.Fatal("Do succeeded")
			}
			if c, o := e.count(t); c != 0 || o != 0 {
				t.Fatalf("after the failure: %d charge rows, %d outbox rows, want none", c, o)
			}
			if s := e.state(t); s != backends.StateReleased {
				t.Fatalf("after the failure the key is %v, want released", s)
			}
			if _, err := e.do(ctx, &runs, nil); err != nil {
				t.Fatal(err)
			}
			if c, o := e.count(t); runs.Load() != 2 || c != 1 || o != 1 {
				t.Fatalf("after the retry: %d runs, %d charge rows, %d outbox rows, want 2, 1 and 1", runs.Load(), c, o)
			}
		})
	}
}

// Without a lease in its context, WithTx runs nothing and begins no
// transaction.
func TestWithTxNeedsALease(t *testing.T) {
	e := newMyEnv(t)
	ran := false
	err := e.outbox.WithTx(context.Background(), func(*mysqloutbox.Tx) error { ran = true; return nil })
	if !errors.Is(err, mysqloutbox.ErrNoLease) {
		t.Fatalf("got %v, want ErrNoLease", err)
	}
	if ran {
		t.Error("the function ran without a lease")
	}
	if n := e.db.Stats().InUse; n != 0 {
		t.Errorf("%d connections in use, want none", n)
	}
}

// A panic in the function rolls the transaction back: its connection is
// no longer in use, nothing is recorded, and Do releases the key. WithTx
// is given a context that is never cancelled (the lease kept), so that
// the rollback is its own, not database/sql's when Do's context ends.
func TestWithTxPanicRollsBack(t *testing.T) {
	e := newMyEnv(t)
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Errorf("recovered %v, want the function's panic", r)
			}
		}()
		_, _ = idempotency.Do(context.Background(), e.idem, "o1", func(ctx context.Context) (struct{}, error) {
			return struct{}{}, e.outbox.WithTx(context.WithoutCancel(ctx), func(tx *mysqloutbox.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO `+e.charges+` VALUES (?)`, "o1"); err != nil {
					return err
				}
				panic("kaboom")
			})
		})
	}()
	if n := e.db.Stats().InUse; n != 0 {
		e.leaked.Store(true)
		t.Fatalf("%d connections still in use: the transaction was never ended", n)
	}
	if c, o := e.count(t); c != 0 || o != 0 {
		t.Fatalf("after a panic: %d charge rows, %d outbox rows, want none", c, o)
	}
	if s := e.state(t); s != backends.StateReleased {
		t.Fatalf("after a panic the key is %v, want released", s)
	}
}
