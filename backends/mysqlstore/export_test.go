package mysqlstore

import "context"

// DetectFlavor returns the dialect s uses, detecting it if needed.
func DetectFlavor(ctx context.Context, s *Store) (Flavor, error) { return s.detectFlavor(ctx) }

// AcquireUpsert returns Acquire's upsert as the store runs it, without a
// RETURNING clause, with ? placeholders, and the names of its parameters
// in order: key, owner, ttl and ret (in microseconds), fp.
func AcquireUpsert(s *Store) (query string, names []string) {
	return s.sql.acquire.sql, s.sql.acquire.names
}
