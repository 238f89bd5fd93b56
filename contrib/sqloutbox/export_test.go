package sqloutbox

import "github.com/watermill-idempotency/idempotency/contrib/sqloutbox/internal/outbox"

// SetBeforeCommit sets the hook that runs between a handler's completion
// and its commit, in the Postgres and the MySQL outbox alike.
func SetBeforeCommit(f func()) { outbox.BeforeCommit = f }
