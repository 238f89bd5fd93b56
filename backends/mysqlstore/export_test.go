package mysqlstore

import (
	"context"

	"github.com/watermill-idempotency/idempotency/backends"
)

// DetectFlavor returns the dialect s uses, detecting it if needed.
func DetectFlavor(ctx context.Context, s *Store) (Flavor, error) { return s.detectFlavor(ctx) }

// AcquireUpsert returns Acquire's upsert as the store runs it, without a
// RETURNING clause, with ? placeholders, and the names of its parameters
// in order: key, owner, origin, ttl and ret (in microseconds), fp.
func AcquireUpsert(s *Store) (query string, names []string) {
	return s.sql.acquire.sql, s.sql.acquire.names
}

// KeyStatements returns the statements that find a record by its key, by
// name, with ? placeholders: key first, then, for those that check a
// lease, its owner and token.
func KeyStatements(s *Store) map[string]string {
	return map[string]string{
		"acquire read": s.sql.acquireRead.sql,
		"still held":   s.sql.stillHeld.sql,
		"inspect":      s.sql.inspect.sql,
		"delete live":  s.sql.deleteLive.sql,
		"delete any":   s.sql.deleteAny.sql,
		// The lease's updates bind their own values first.
		"renew":    s.sql.renew.sql,
		"complete": s.sql.complete.sql,
		"release":  s.sql.release.sql,
	}
}

// QueuedAcquires returns how many Acquire calls wait in the store's
// batcher for a statement to come back.
func QueuedAcquires(s *Store) int { return s.acquires.Queued() }

// DefaultInFlight is Options.InFlight's default for a db whose limit on
// open connections is maxOpen in a process of procs Ps.
func DefaultInFlight(maxOpen, procs int) int { return defaultInFlight(maxOpen, procs) }

// FirstStatements returns the store's "acquire first" statement and its
// form for n calls together.
func FirstStatements(s *Store, n int) (one, together string) {
	return s.sql.acquireFirst[1].sql, s.sql.acquireFirst[n].sql
}

// QueuedCompletes returns how many Complete calls wait in the store's
// batcher for a statement to come back.
func QueuedCompletes(s *Store) int { return s.completes.Queued() }

// CompleteTogether returns the statement that completes leases together,
// with nil outputs, and its arguments.
func CompleteTogether(s *Store, leases []backends.Lease) (query string, args []any) {
	ps := make([]*params, len(leases))
	for i, l := range leases {
		ps[i] = &params{key: []byte(l.Key), owner: []byte(l.Owner), token: l.Token}
	}
	st := s.sql.completeTogether[len(leases)]
	return st.sql, st.argsOf(ps)
}
