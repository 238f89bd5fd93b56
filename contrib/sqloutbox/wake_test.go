package sqloutbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/internal/outboxtest"
)

// The Forwarders of these tests poll every hour: what they forward within
// the test's minute, a wake brought.
const never = time.Hour

// newQuietPgEnv is a pgEnv on a Postgres of the test's own. A Postgres
// Forwarder reads only the rows of transactions older than every
// transaction still running on the server; on a server that other tests
// share, one of theirs that stays open would hold back the rows a wake
// announces until the next poll, an hour away.
func newQuietPgEnv(t *testing.T) *pgEnv {
	t.Helper()
	return newPgEnvAt(t, startPostgres(t).url())
}

// forwarding runs ob's Forwarder into a broker until the test ends, and
// returns what it forwards to topic "receipts". It waits until the
// Forwarder has read the empty table and the quick retries that follow
// its start are over: from then on, only a wake makes it read again.
func forwarding(t *testing.T, ob *sqloutbox.Postgres) <-chan *message.Message {
	t.Helper()
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	received, err := broker.Subscribe(context.Background(), "receipts")
	if err != nil {
		t.Fatal(err)
	}
	fwd, err := ob.NewForwarder(broker, nil, forwarder.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fwd.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		_ = fwd.Close()
		<-done
	})
	<-fwd.Running()
	time.Sleep(time.Second) // past the quick retries (127 ms)
	return received
}

// arrives fails the test unless the receipt named uuid arrives within a
// minute, and returns how long it took.
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
			t.Fatalf("%s not forwarded in a minute: no wake reached the Forwarder, which polls every %v", uuid, never)
			return 0
		}
	}
}

// A commit of this process wakes its Forwarder (no LISTEN here).
func TestForwarderWokenByCommit(t *testing.T) {
	e := newQuietPgEnv(t)
	ob, err := sqloutbox.NewPostgres(e.pool, e.store, sqloutbox.Options{Topic: e.topic, PollInterval: never, NoListen: true})
	if err != nil {
		t.Fatal(err)
	}
	received := forwarding(t, ob)
	for i := range 3 {
		order := fmt.Sprintf("o%d", i)
		if _, err := e.run(e.outbox.Handler(e.charge(nil)), order); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s forwarded %v after its commit", order, arrives(t, received, "receipt-"+order))
	}
	if n := len(e.listenerPIDs(t)); n != 0 {
		t.Errorf("%d connections listen with NoListen set, want 0", n)
	}
}

// foreignWrite commits a receipt into the outbox as another service would:
// watermill-sql's publisher in the Forwarder's envelope, on a transaction
// of its own, which wakes nothing in this process.
func (e *pgEnv) foreignWrite(t *testing.T, uuid string) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: e.topic}).Publish("receipts", message.NewMessage(uuid, nil)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// listenerPIDs returns the backends of the connections that listen for
// the notifications of e's outbox.
func (e *pgEnv) listenerPIDs(t *testing.T) []int32 {
	t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`SELECT pid FROM pg_stat_activity WHERE query IN ($1, '-- ' || $1) AND datname = current_database()`, `LISTEN "sqloutbox:`+e.topic+`"`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var pids []int32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return pids
}

// waitListener waits for a listening connection other than the one of
// pid old, and returns its pid.
func (e *pgEnv) waitListener(t *testing.T, old int32) int32 {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		for _, pid := range e.listenerPIDs(t) {
			if pid != old {
				return pid
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no connection listens for the outbox's notifications after a minute")
	return 0
}

// Another writer's commit wakes the Forwarder through the trigger's
// notification; after its connection is killed, the Forwarder listens
// again and reads what was committed while it did not.
func TestForwarderWokenByOtherWriters(t *testing.T) {
	e := newQuietPgEnv(t)
	ob, err := sqloutbox.NewPostgres(e.pool, e.store, sqloutbox.Options{Topic: e.topic, PollInterval: never})
	if err != nil {
		t.Fatal(err)
	}
	received := forwarding(t, ob)
	pid := e.waitListener(t, 0)
	e.foreignWrite(t, "r1")
	t.Logf("r1 forwarded %v after its commit", arrives(t, received, "r1"))

	// Kill the listening connection's backend, and commit at once: the
	// notification goes nowhere.
	if _, err := e.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); e.count(t, fmt.Sprintf(`SELECT count(*) FROM pg_stat_activity WHERE pid = %d`, pid)) > 0; {
		if time.Now().After(deadline) {
			t.Fatal("the killed backend is still there after a minute")
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.foreignWrite(t, "r2")
	t.Logf("r2, committed while no connection listened, forwarded %v after its commit", arrives(t, received, "r2"))
	e.waitListener(t, pid)
	time.Sleep(time.Second) // past the quick retries of the wake above
	e.foreignWrite(t, "r3")
	t.Logf("r3 forwarded %v after its commit, on the new connection", arrives(t, received, "r3"))
}

// Migrate creates the trigger once, when several processes run it at
// once and when it runs again after an upgrade from a table without it.
func TestMigrateCreatesTheTrigger(t *testing.T) {
	e := newPgEnv(t)
	triggers := func() int {
		return e.count(t, `SELECT count(*) FROM pg_trigger WHERE tgrelid = '"watermill_`+e.topic+`"'::regclass AND tgname = 'sqloutbox_notify'`)
	}
	if n := triggers(); n != 1 {
		t.Fatalf("%d triggers after Migrate, want 1", n)
	}
	if _, err := e.pool.Exec(context.Background(), `DROP TRIGGER sqloutbox_notify ON "watermill_`+e.topic+`"`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { errs <- e.outbox.Migrate(context.Background()) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Migrate at once: %v", err)
		}
	}
	if n := triggers(); n != 1 {
		t.Errorf("%d triggers after Migrate again, want 1", n)
	}
}

// A commit through WithTx notifies other processes only when no Forwarder
// of the outbox runs in this one (which the commit wakes); other writers
// always notify.
func TestCommitNotifiesWithoutALocalForwarder(t *testing.T) {
	e := newQuietPgEnv(t)
	ctx := context.Background()
	pc, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := pc.Hijack()
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	sentinel := unique("sentinel")
	for _, ch := range []string{"sqloutbox:" + e.topic, sentinel} {
		if _, err := conn.Exec(ctx, `LISTEN "`+ch+`"`); err != nil {
			t.Fatal(err)
		}
	}
	// notified counts the outbox's notifications committed before a
	// sentinel sent now: notifications arrive in commit order.
	notified := func() int {
		t.Helper()
		if _, err := e.pool.Exec(ctx, `SELECT pg_notify($1, '')`, sentinel); err != nil {
			t.Fatal(err)
		}
		wait, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		n := 0
		for {
			msg, err := conn.WaitForNotification(wait)
			if err != nil {
				t.Fatalf("waiting for the sentinel: %v", err)
			}
			if msg.Channel == sentinel {
				return n
			}
			n++
		}
	}
	if _, err := e.run(e.outbox.Handler(e.charge(nil)), "o1"); err != nil {
		t.Fatal(err)
	}
	if n := notified(); n != 1 {
		t.Errorf("no Forwarder in the process: the commit sent %d notifications, want 1", n)
	}
	ob, err := sqloutbox.NewPostgres(e.pool, e.store, sqloutbox.Options{Topic: e.topic, NoListen: true})
	if err != nil {
		t.Fatal(err)
	}
	received := forwarding(t, ob)
	if _, err := e.run(e.outbox.Handler(e.charge(nil)), "o2"); err != nil {
		t.Fatal(err)
	}
	arrives(t, received, "receipt-o2")
	if n := notified(); n != 0 {
		t.Errorf("a Forwarder in the process: the commit sent %d notifications, want 0", n)
	}
	e.foreignWrite(t, "r3")
	if n := notified(); n != 1 {
		t.Errorf("another writer's commit sent %d notifications, want 1", n)
	}
}

// With Options.Retention the Forwarder deletes what it forwarded once it
// is older than the retention: the table empties.
func TestForwarderPrunesWithRetention(t *testing.T) {
	e := newPgEnv(t)
	ob, err := sqloutbox.NewPostgres(e.pool, e.store, sqloutbox.Options{Topic: e.topic, Retention: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	received := forwarding(t, ob)
	for i := range 5 {
		if _, err := e.run(e.outbox.Handler(e.charge(nil)), fmt.Sprintf("o%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for i := range 5 {
		want = append(want, fmt.Sprintf("receipt-o%d", i))
	}
	outboxtest.ArriveAll(t, received, want...)
	deadline := time.Now().Add(time.Minute)
	for n := e.outboxRows(t); n > 0; n = e.outboxRows(t) {
		if time.Now().After(deadline) {
			t.Fatalf("%d forwarded rows still in the outbox a minute later", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
