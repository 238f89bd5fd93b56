package storetest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// Table is a business table in a SQL store's database that checks fencing
// tokens: one row per key, written only by a token higher than the row's,
// with a count of the writes it accepted. The handlers of a [TxStorm]
// write it in the same transaction as the key's completion.
type Table struct {
	// Read returns each key's count of accepted writes, or only key's if
	// key is not empty.
	Read func(key string) (map[string]int, error)

	mu        sync.Mutex
	committed map[string]map[int64]bool // key -> tokens whose transaction committed
	refused   atomic.Int64
}

var _ Effects = (*Table)(nil)

// Refused counts a write the table refused for lease's stale token and
// returns the error its handler returns.
func (e *Table) Refused(lease backends.Lease) error {
	e.refused.Add(1)
	return fmt.Errorf("%w: key %q token %d", ErrStale, lease.Key, lease.Token)
}

func (e *Table) markCommitted(key string, token int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.committed == nil {
		e.committed = map[string]map[int64]bool{}
	}
	if e.committed[key] == nil {
		e.committed[key] = map[int64]bool{}
	}
	e.committed[key][token] = true
}

// Applied reports whether the table holds an accepted write for key.
func (e *Table) Applied(key string) (bool, error) {
	rows, err := e.Read(key)
	return rows[key] > 0, err
}

// Tally returns every key's accepted writes and committed holders, and how
// many stale writes were refused.
func (e *Table) Tally() (map[string]Tally, int64, error) {
	rows, err := e.Read("")
	if err != nil {
		return nil, 0, err
	}
	out := make(map[string]Tally, len(rows))
	for key, applied := range rows {
		out[key] = Tally{Applied: applied}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for key, tokens := range e.committed {
		t := out[key]
		t.Holders = len(tokens)
		out[key] = t
	}
	return out, e.refused.Load(), nil
}

// TxStorm is the exactly-once storm of the SQL stores: eight instances,
// each with its own store and four workers (a broker's consumer count),
// three copies of each of 2,000 keys at once. Each handler writes its
// key's effect to Table and completes the key in one transaction. The
// first attempt of every third key rolls back after writing; the first
// commit of another third of the keys loses its return (the process died
// before the ack). Run checks that every key's effect is applied exactly
// once.
type TxStorm struct {
	// Table is the business table the handlers write their effects to.
	Table *Table
	// Store returns instance i's store.
	Store func(t testing.TB, i int) backends.Store
	// Begin returns instance i's transactions: begin starts one in which
	// the effect of lease is written to Table and the key completed under
	// lease, and returns its commit and its rollback (called after commit
	// too, as a deferred rollback is).
	Begin func(t testing.TB, i int) func(ctx context.Context, lease backends.Lease) (commit func() error, rollback func(), err error)
}

// Run runs the storm and checks it.
func (s TxStorm) Run(t *testing.T) {
	t.Helper()
	var rollbacks, lostReturns atomic.Int64
	var lost sync.Map
	Storm{
		Instances: 8, Keys: 2000, Copies: 3, Workers: 4, Effects: s.Table, Store: s.Store,
		Handler: func(i int) message.HandlerFunc {
			begin := s.Begin(t, i)
			return func(msg *message.Message) ([]*message.Message, error) {
				ctx := msg.Context()
				lease, _ := idempotency.LeaseFromContext(ctx)
				commit, rollback, err := begin(ctx, lease)
				if err != nil {
					return nil, err
				}
				defer rollback()
				if lease.Attempt == 1 && failsFirst(lease.Key) {
					rollbacks.Add(1)
					return nil, errors.New("injected rollback")
				}
				if err := commit(); err != nil {
					return nil, err
				}
				s.Table.markCommitted(lease.Key, lease.Token)
				if _, loaded := lost.LoadOrStore(lease.Key, true); !loaded && losesReturn(lease.Key) {
					lostReturns.Add(1)
					return nil, errors.New("injected lost return after commit")
				}
				return nil, nil
			}
		},
	}.Run(t)
	if rollbacks.Load() == 0 || lostReturns.Load() == 0 {
		t.Errorf("injected %d rollbacks and %d lost returns; want both", rollbacks.Load(), lostReturns.Load())
	}
	t.Logf("%d rollbacks and %d lost returns injected", rollbacks.Load(), lostReturns.Load())
	rows, err := s.Table.Read("")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2000 {
		t.Errorf("%d business rows for 2000 keys", len(rows))
	}
}

// losesReturn reports whether key's first committed attempt then loses
// its return, as a process dying between commit and ack would.
func losesReturn(key string) bool {
	h := fnv.New32a()
	h.Write([]byte(key))
	return h.Sum32()%3 == 1
}
