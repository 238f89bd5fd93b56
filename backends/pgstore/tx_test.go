package pgstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// txEnv is a store and a business table ("charges") in one schema. The
// business table has no unique constraint on purpose: exactly-once must
// come from the store, not from the table.
type txEnv struct {
	pool  *pgxpool.Pool
	store *pgstore.Store
	table string
}

func newTxEnv(t *testing.T) *txEnv {
	pool := testserver.PostgresPool(t)
	store := newStore(t, pool, pgstore.Options{})
	table := store.Options().Schema + ".charges"
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+table+` (order_id text NOT NULL, token bigint NOT NULL)`)
	require.NoError(t, err)
	return &txEnv{pool: pool, store: store, table: table}
}

// charge writes the business row and completes the key in one transaction.
// before and after, if set, fail the handler before the commit (rollback)
// or after it (the work is committed, the handler's return is lost).
func (e *txEnv) charge(before, after func(orderID string) error) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		lease, _ := idempotency.LeaseFromContext(ctx)
		orderID := string(msg.Payload)
		out := []*message.Message{message.NewMessage("charged-"+orderID, []byte(orderID))}

		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
		if _, err := tx.Exec(ctx, `INSERT INTO `+e.table+` VALUES ($1, $2)`, orderID, lease.Token); err != nil {
			return nil, err
		}
		if err := e.store.CompleteTx(ctx, tx, lease, out); err != nil {
			return nil, err
		}
		if before != nil {
			if err := before(orderID); err != nil {
				return nil, err // rolled back by the deferred Rollback
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return nil, err
		}
		if after != nil {
			if err := after(orderID); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
}

func (e *txEnv) rows(t *testing.T, orderID string) int {
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.table+` WHERE order_id = $1`, orderID).Scan(&n))
	return n
}

func newIdem(t *testing.T, store backends.Store, counters *idempotency.Counters) *idempotency.Idempotency {
	idem, err := idempotency.New(idempotency.Config{
		Store: store, Namespace: "charge", Key: keyfunc.Func(func(m *message.Message) (string, error) { return string(m.Payload), nil }),
		LeaseTTL: 5 * time.Second, Timing: idempotency.Timing{Poll: idempotency.Backoff{Initial: 5 * time.Millisecond}}, Observer: counters,
	})
	require.NoError(t, err)
	return idem
}

// The handler commits its row and the completion together, then its return
// is lost (the process died before the ack). The redelivery is dropped,
// the row exists once, and the output stored in the transaction is
// replayed.
func TestTxCommitThenReturnLost(t *testing.T) {
	e := newTxEnv(t)
	counters := &idempotency.Counters{}
	idem := newIdem(t, e.store, counters)
	lost := errors.New("process died before the ack")
	h := idem.Middleware(e.charge(nil, func(string) error { return lost }))

	_, err := h(message.NewMessage("m1", []byte("o-1")))
	require.ErrorIs(t, err, lost, "nacked")
	out, err := h(message.NewMessage("m1-redelivered", []byte("o-1")))
	require.NoError(t, err)
	require.Equal(t, 1, e.rows(t, "o-1"), "the business row exists once")
	require.EqualValues(t, 1, counters.Count(idempotency.OutcomeDuplicate), "the redelivery was dropped")
	require.Len(t, out, 1)
	require.Equal(t, "charged-o-1", out[0].UUID, "the output committed with the work is replayed")
}

// The handler's transaction rolls back: neither the row nor the completion
// is recorded, the key is released, and the retry writes the row.
func TestTxRollbackIsRetried(t *testing.T) {
	e := newTxEnv(t)
	counters := &idempotency.Counters{}
	idem := newIdem(t, e.store, counters)
	var failed atomic.Bool
	h := idem.Middleware(e.charge(func(string) error {
		if failed.CompareAndSwap(false, true) {
			return errors.New("payment provider declined, try again")
		}
		return nil
	}, nil))

	_, err := h(message.NewMessage("m1", []byte("o-1")))
	require.Error(t, err)
	require.Equal(t, 0, e.rows(t, "o-1"), "rolled back")
	rec, err := e.store.Inspect(context.Background(), "charge:o-1")
	require.NoError(t, err)
	require.Equal(t, backends.StateReleased, rec.State, "the completion rolled back with the row, and the key was released")

	out, err := h(message.NewMessage("m1", []byte("o-1")))
	require.NoError(t, err)
	require.Len(t, out, 1)
	require.Equal(t, 1, e.rows(t, "o-1"))
	require.EqualValues(t, 1, counters.Count(idempotency.OutcomeProcessed))
}

// The middleware sees that the handler completed the key itself and
// reports it as processed, not as a lost lease.
func TestTxCompletionIsRecognised(t *testing.T) {
	e := newTxEnv(t)
	var events []idempotency.Event
	idem, err := idempotency.New(idempotency.Config{
		Store: e.store, Namespace: "charge",
		Key:      keyfunc.Func(func(m *message.Message) (string, error) { return string(m.Payload), nil }),
		Observer: idempotency.ObserverFunc(func(_ context.Context, ev idempotency.Event) { events = append(events, ev) }),
	})
	require.NoError(t, err)
	out, err := idem.Middleware(e.charge(nil, nil))(message.NewMessage("m1", []byte("o-1")))
	require.NoError(t, err)
	require.Len(t, out, 1)
	require.Len(t, events, 1)
	require.Equal(t, idempotency.OutcomeProcessed, events[0].Outcome)
	require.True(t, events[0].CompletedByHandler)
}

// CompleteTxOutput stores the bytes it is given exactly (not messages to
// encode: here, bytes no message encoding starts with), and only if the
// transaction commits: rolled back, the key stays held by the lease,
// which can still complete it.
func TestCompleteTxOutputStoresTheBytes(t *testing.T) {
	pool := testserver.PostgresPool(t)
	s := newStore(t, pool, pgstore.Options{})
	ctx := context.Background()
	output := []byte("HTTP/1.1 201\x00\xff{\"id\":7}")
	lease := acquire(t, s, "tx-output", "holder").Lease

	require.ErrorIs(t, s.CompleteTxOutput(ctx, nil, lease, output), backends.ErrInvalidRequest, "a nil transaction")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, s.CompleteTxOutput(ctx, tx, lease, output))
	require.NoError(t, tx.Rollback(ctx))
	rec, err := s.Inspect(ctx, lease.Key)
	require.NoError(t, err)
	require.Equal(t, backends.StateInProgress, rec.State, "rolled back: the key is still held")
	require.Equal(t, lease.Token, rec.Token)
	require.Nil(t, rec.Output)
	require.NoError(t, s.Renew(ctx, lease, time.Minute), "the lease still holds the key")

	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, s.CompleteTxOutput(ctx, tx, lease, output))
	require.NoError(t, tx.Commit(ctx))
	rec, err = s.Inspect(ctx, lease.Key)
	require.NoError(t, err)
	require.Equal(t, backends.StateCompleted, rec.State)
	require.Equal(t, output, rec.Output, "the bytes as given")
	dup := acquire(t, s, lease.Key, "duplicate")
	require.Equal(t, backends.StatusCompleted, dup.Status)
	require.Equal(t, output, dup.Output, "a duplicate gets the bytes as given")
}
