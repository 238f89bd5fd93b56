package mysqloutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/mysqloutbox"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// A nil database is a nil client, as for every store's constructor, and
// still invalid options; a nil store is invalid options only. No server
// is needed: sql.Open dials nothing.
func TestNilDatabaseOrStore(t *testing.T) {
	_, err := mysqloutbox.New(nil, nil, mysqloutbox.Options{})
	if !errors.Is(err, backends.ErrNilClient) || !errors.Is(err, mysqloutbox.ErrInvalidOptions) {
		t.Errorf("nil db: got %v, want ErrNilClient and ErrInvalidOptions", err)
	}
	db, err := sql.Open("mysql", "idem:idem@tcp(127.0.0.1:1)/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	_, err = mysqloutbox.New(db, nil, mysqloutbox.Options{})
	if !errors.Is(err, mysqloutbox.ErrInvalidOptions) || errors.Is(err, backends.ErrNilClient) {
		t.Errorf("nil store: got %v, want ErrInvalidOptions only", err)
	}
}

// The outbox on MariaDB: a duplicate of a completed key publishes nothing, a
// failed handler records nothing, and the transaction is the outbox's.
func TestMySQL(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("mysql", service(t, "MYSQL_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	topic, charges, keys := unique("outbox"), unique("charges"), unique("keys")
	store, err := mysqlstore.New(db, mysqlstore.Options{Table: keys})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := mysqloutbox.New(db, store, mysqloutbox.Options{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+charges+` (order_id VARCHAR(64) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+charges+", "+keys+", `watermill_"+topic+"`")
	})
	idem, err := idempotency.New(idempotency.Config{Store: store, Key: keyfunc.Metadata("order"), Namespace: "charge"})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	handler := func(fail error) message.HandlerFunc {
		h := ob.Handler(func(tx *mysqloutbox.Tx, msg *message.Message) error {
			if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+charges+` VALUES (?)`, msg.Metadata.Get("order")); err != nil {
				return err
			}
			if err := tx.Publish("receipts", message.NewMessage("receipt-"+msg.Metadata.Get("order"), nil)); err != nil {
				return err
			}
			if err := tx.Commit(); !errors.Is(err, mysqloutbox.ErrOwnedTx) {
				t.Errorf("Commit: got %v, want ErrOwnedTx", err)
			}
			return fail
		})
		return idem.Middleware(func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) })
	}
	deliver := func(fail error) ([]*message.Message, error) {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set("order", "o1")
		return handler(fail)(msg)
	}
	count := func() (c, o int) {
		t.Helper()
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+charges).Scan(&c); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM `watermill_"+topic+"`").Scan(&o); err != nil {
			t.Fatal(err)
		}
		return c, o
	}

	if _, err := deliver(boom); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the handler's error", err)
	}
	if c, o := count(); c != 0 || o != 0 {
		t.Fatalf("after a failed handler: %d charge rows, %d outbox rows, want none", c, o)
	}
	for i := range 3 {
		out, err := deliver(nil)
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
		if len(out) != 0 {
			t.Fatalf("delivery %d: %d messages for the router to publish, want none", i, len(out))
		}
	}
	if c, o := count(); c != 1 || o != 1 {
		t.Fatalf("%d charge rows, %d outbox rows, want 1 and 1", c, o)
	}
	rec, err := store.Inspect(ctx, "charge:o1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != backends.StateCompleted || len(rec.Output) != 0 {
		t.Errorf("record %v with %d bytes of output, want completed with none to replay", rec.State, len(rec.Output))
	}
}

// service returns the address of a server the tests use, from the
// environment variable name, and fails the test if it is not set: `make
// test` starts private servers and sets these.
func service(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set. Run the tests with `make test`, which starts private servers and sets it, "+
			"or set it to a server the tests may write to", name)
	}
	return v
}

// unique returns a name for this test's tables, holding this run's id
// ($IDEM_TEST_RUN), made of letters, digits and underscores.
func unique(prefix string) string {
	s := fmt.Sprintf("%s_%s_%d_%d", prefix, os.Getenv("IDEM_TEST_RUN"), os.Getpid(), time.Now().UnixNano()%1e9)
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '_'
	}, s)
}
