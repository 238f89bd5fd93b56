package mysqlstore

import "context"

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
