package middleware

// CompletedCacheLen is the number of entries m's completed-key cache
// holds, for the tests outside the package.
func CompletedCacheLen(m *Idempotency) int { return m.cache.len() }
