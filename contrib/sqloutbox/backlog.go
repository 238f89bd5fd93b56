package sqloutbox

import (
	"context"
	"time"

	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/internal/outbox"
)

// ErrBacklogUnsupported is returned by Backlog for an outbox whose
// Options.Schema or Options.Offsets is not the default one, whose tables
// it cannot read.
var ErrBacklogUnsupported = outbox.ErrBacklogUnsupported

// Backlog returns how many messages wait in the outbox for the Forwarder
// (committed, and past the offset its consumer group stored), and how long
// the oldest of them has waited, by the database's clock (zero if none
// does). It is one range scan of the outbox table's primary key over the
// rows not yet forwarded. It implements contrib/idemotel's OutboxBacklog, for
// the outbox gauges.
//
// It returns [ErrBacklogUnsupported] unless Options.Schema and
// Options.Offsets are the defaults.
func (p *Postgres) Backlog(ctx context.Context) (messages int64, oldest time.Duration, err error) {
	return p.outbox.Backlog(ctx)
}
