package sqloutbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// events records what the middleware reports of each call.
type events struct {
	mu  sync.Mutex
	all []idempotency.Event
}

func (r *events) Observe(_ context.Context, ev idempotency.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, ev)
}

func (r *events) list() []idempotency.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]idempotency.Event(nil), r.all...)
}

// doIdem is the middleware for Do on the env's store, in namespace
// "charge", reporting to the returned recorder.
func (e *pgEnv) doIdem(t *testing.T, leaseTTL time.Duration) (*idempotency.Idempotency, *events) {
	t.Helper()
	rec := &events{}
	idem, err := idempotency.New(idempotency.Config{Store: e.store, Namespace: "charge", LeaseTTL: leaseTTL, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.store.Close() }) // the listener of waiting calls, if any
	return idem, rec
}

// chargeTx writes order's charge row and its receipt through the outbox.
func (e *pgEnv) chargeTx(ctx context.Context, tx *sqloutbox.PgxTx, order string) error {
	if _, err := tx.Exec(ctx, `INSERT INTO `+e.charges+` VALUES ($1)`, order); err != nil {
		return err
	}
	return tx.Publish("receipts", message.NewMessage("receipt-"+order, []byte(order)))
}

func (e *pgEnv) record(t *testing.T, key string) backends.Record {
	t.Helper()
	rec, err := e.store.Inspect(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// A function run by Do writes its row, its receipt and its key's
// completion in one transaction: the key is completed when WithTx
// returns, before Do's own completion, which finds it so and does not
// complete it again. A duplicate call runs nothing and gets the zero value
// (the completion in the transaction records no result).
func TestWithTxUnderDo(t *testing.T) {
	e := newPgEnv(t)
	idem, rec := e.doIdem(t, 0)
	ctx := context.Background()
	var runs atomic.Int32
	charge := func(ctx context.Context) (string, error) {
		runs.Add(1)
		if err := e.outbox.WithTx(ctx, func(tx *sqloutbox.PgxTx) error { return e.chargeTx(ctx, tx, "o1") }); err != nil {
			return "", err
		}
		if r := e.record(t, "charge:o1"); r.State != backends.StateCompleted {
			t.Errorf("after WithTx the key is %v, want completed by the transaction", r.State)
		}
		return "charged", nil
	}
	got, err := idempotency.Do(ctx, idem, "o1", charge)
	if err != nil || got != "charged" {
		t.Fatalf("Do: %q, %v", got, err)
	}
	if c, o := e.chargeRows(t), e.outboxRows(t); c != 1 || o != 1 {
		t.Fatalf("%d charge rows, %d outbox rows, want 1 and 1", c, o)
	}
	evs := rec.list()
	if len(evs) != 1 || evs[0].Outcome != idempotency.OutcomeProcessed || !evs[0].CompletedByHandler {
		t.Fatalf("events %+v, want one OutcomeProcessed with CompletedByHandler: the key completed in the transaction, once", evs)
	}
	if r := e.record(t, "charge:o1"); r.State != backends.StateCompleted || len(r.Output) != 0 || r.Token != evs[0].Lease.Token {
		t.Errorf("record %v, token %d, %d bytes of output; want completed by token %d with none", r.State, r.Token, len(r.Output), evs[0].Lease.Token)
	}

	got, err = idempotency.Do(ctx, idem, "o1", charge)
	if err != nil || got != "" {
		t.Fatalf("duplicate Do: %q, %v; want the zero value", got, err)
	}
	if runs.Load() != 1 {
		t.Errorf("the function ran %d times, want once", runs.Load())
	}
	if c, o := e.chargeRows(t), e.outboxRows(t); c != 1 || o != 1 {
		t.Fatalf("after the duplicate: %d charge rows, %d outbox rows, want 1 and 1", c, o)
	}
	if evs := rec.list(); len(evs) != 2 || evs[1].Outcome != idempotency.OutcomeDuplicate {
		t.Errorf("events %+v, want the second a duplicate", evs)
	}
}

// The function fails after writing its row and its receipt: WithTx rolls
// them back, Do releases the key, and the next call runs and records once.
func TestWithTxErrorRecordsNothing(t *testing.T) {
	e := newPgEnv(t)
	idem, _ := e.doIdem(t, 0)
	ctx := context.Background()
	boom := errors.New("payment declined")
	var runs atomic.Int32
	call := func(fail error) error {
		_, err := idempotency.Do(ctx, idem, "o1", func(ctx context.Context) (struct{}, error) {
			runs.Add(1)
			return struct{}{}, e.outbox.WithTx(ctx, func(tx *sqloutbox.PgxTx) error {
				if err := e.chargeTx(ctx, tx, "o1"); err != nil {
					return err
				}
				return fail
			})
		})
		return err
	}
	if err := call(boom); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the function's error", err)
	}
	if c, o := e.chargeRows(t), e.outboxRows(t); c != 0 || o != 0 {
		t.Fatalf("after a failure: %d charge rows, %d outbox rows, want none", c, o)
	}
	if r := e.record(t, "charge:o1"); r.State != backends.StateReleased {
		t.Fatalf("after a failure the key is %v, want released", r.State)
	}
	if err := call(nil); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 2 {
		t.Errorf("the function ran %d times, want twice", runs.Load())
	}
	if c, o := e.chargeRows(t), e.outboxRows(t); c != 1 || o != 1 {
		t.Fatalf("after the retry: %d charge rows, %d outbox rows, want 1 and 1", c, o)
	}
}

// The commit itself fails (the connection is cut between the completion
// and the commit): the row, the receipt and the completion are all lost
// together, the key is released, and the retry records them once.
func TestWithTxCommitFailureRecordsNothing(t *testing.T) {
	e := newPgEnv(t)
	idem, _ := e.doIdem(t, 0)
	ctx := context.Background()
	var pid atomic.Int32
	sqloutbox.SetBeforeCommit(func() {
		if p := pid.Swap(0); p != 0 {
			// With a timeout, it waits until the backend is gone.
			if _, err := e.pool.Exec(ctx, `SELECT pg_terminate_backend($1, 30000)`, p); err != nil {
				t.Error(err)
			}
		}
	})
	t.Cleanup(func() { sqloutbox.SetBeforeCommit(func() {}) })
	call := func(cut bool) error {
		_, err := idempotency.Do(ctx, idem, "o1", func(ctx context.Context) (struct{}, error) {
			return struct{}{}, e.outbox.WithTx(ctx, func(tx *sqloutbox.PgxTx) error {
				if cut {
					var p int32
					if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&p); err != nil {
						return err
					}
					pid.Store(p)
				}
				return e.chargeTx(ctx, tx, "o1")
			})
		})
		return err
	}
	if err := call(true); err == nil {
		t.Fatal("the commit on a terminated connection succeeded")
	}
	if c, o := e.chargeRows(t), e.outboxRows(t); c != 0 || o != 0 {
		t.Fatalf("after a failed commit: %d charge rows, %d outbox rows, want none", c, o)
	}
	if r := e.record(t, "charge:o1"); r.State != backends.StateReleased {
		t.Fatalf("after a failed commit the key is %v, want released", r.State)
	}
	if err := call(false); err != nil {
		t.Fatal(err)
	}
	if c, o := e.chargeRows(t), e.outboxRows(t); c != 1 || o != 1 {
		t.Fatalf("after the retry: %d charge rows, %d outbox rows, want 1 and 1", c, o)
	}
}

// Without a lease in its context, WithTx runs nothing and begins no
// transaction.
func TestWithTxNeedsALease(t *testing.T) {
	e := newPgEnv(t)
	ran := false
	err := e.outbox.WithTx(context.Background(), func(*sqloutbox.PgxTx) error { ran = true; return nil })
	if !errors.Is(err, sqloutbox.ErrNoLease) {
		t.Fatalf("got %v, want ErrNoLease", err)
	}
	if ran {
		t.Error("the function ran without a lease")
	}
	if n := e.pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections taken from the pool, want none", n)
	}
}

// A panic in the function rolls the transaction back: its connection goes
// back to the pool, nothing is recorded, and Do releases the key.
func TestWithTxPanicRollsBack(t *testing.T) {
	e := newPgEnv(t)
	idem, _ := e.doIdem(t, 0)
	ctx := context.Background()
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Errorf("recovered %v, want the function's panic", r)
			}
		}()
		_, _ = idempotency.Do(ctx, idem, "o1", func(ctx context.Context) (struct{}, error) {
			return struct{}{}, e.outbox.WithTx(ctx, func(tx *sqloutbox.PgxTx) error {
				if err := e.chargeTx(ctx, tx, "o1"); err != nil {
					return err
				}
				panic("kaboom")
			})
		})
	}()
	if n := e.pool.Stat().AcquiredConns(); n != 0 {
		e.leaked.Store(true)
		t.Fatalf("%d connections still taken from the pool: the transaction was never ended", n)
	}
	if c, o := e.chargeRows(t), e.outboxRows(t); c != 0 || o != 0 {
		t.Fatalf("after a panic: %d charge rows, %d outbox rows, want none", c, o)
	}
	if r := e.record(t, "charge:o1"); r.State != backends.StateReleased {
		t.Fatalf("after a panic the key is %v, want released", r.State)
	}
}

// 20 goroutines call Do with the same key at once, each until it
// succeeds; the function writes its row and receipt through WithTx, and
// its first three runs fail after writing them. Exactly one charge row
// and one receipt are recorded, by the one run that completed the key in
// its transaction.
func TestWithTxConcurrentDo(t *testing.T) {
	e := newPgEnv(t)
	idem, rec := e.doIdem(t, 0)
	ctx := context.Background()
	boom := errors.New("transient failure")
	var runs, failures atomic.Int32
	charge := func(ctx context.Context) (struct{}, error) {
		runs.Add(1)
		return struct{}{}, e.outbox.WithTx(ctx, func(tx *sqloutbox.PgxTx) error {
			if err := e.chargeTx(ctx, tx, "o1"); err != nil {
				return err
			}
			if failures.Add(1) <= 3 {
				return boom
			}
			return nil
		})
	}
	const callers = 20
	deadline := time.Now().Add(2 * time.Minute)
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, err := idempotency.Do(ctx, idem, "o1", charge)
				var inProgress *idempotency.InProgressError
				if err == nil || !(errors.Is(err, boom) || errors.As(err, &inProgress)) || time.Now().After(deadline) {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a caller gave up: %v", err)
		}
	}
	if c, o := e.chargeRows(t), e.outboxRows(t); c != 1 || o != 1 {
		t.Fatalf("%d charge rows, %d outbox rows, want 1 and 1", c, o)
	}
	var processed, byHandler int
	for _, ev := range rec.list() {
		if ev.Outcome == idempotency.OutcomeProcessed {
			processed++
			if ev.CompletedByHandler {
				byHandler++
			}
		}
	}
	if processed != 1 || byHandler != 1 {
		t.Errorf("%d calls processed, %d of them completed in the transaction; want 1 and 1", processed, byHandler)
	}
	if r := runs.Load(); r != 4 {
		t.Errorf("the function ran %d times, want 4 (3 failures, then the one that recorded)", r)
	}
	t.Logf("%d runs for %d callers, %d events", runs.Load(), callers, len(rec.list()))
}
