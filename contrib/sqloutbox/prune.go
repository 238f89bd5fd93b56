package sqloutbox

import (
	"context"
	"time"

	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/internal/outbox"
)

// ErrPruneUnsupported is returned by Prune for an outbox whose
// Options.Schema or Options.Offsets is not the default one, whose tables
// it cannot read.
var ErrPruneUnsupported = outbox.ErrPruneUnsupported

// DefaultPruneBatch is the number of rows Prune deletes per statement when
// given none.
const DefaultPruneBatch = outbox.DefaultPruneBatch

// Prune deletes the outbox rows the Forwarder has passed (at or before the
// offset its consumer group stored) that are older than olderThan, by the
// database's clock, and returns how many it deleted. It deletes at most
// batch rows (DefaultPruneBatch if batch is not positive) per statement,
// each a short transaction of its own that locks only rows behind the
// Forwarder, until a statement deletes fewer: writers and the Forwarder
// go on meanwhile. A row the Forwarder has not passed is never deleted.
// Call it from a periodic job (every few minutes, with the retention you
// want to keep for inspection); docs/outbox.md has the details.
//
// It returns [ErrPruneUnsupported] unless Options.Schema and
// Options.Offsets are the defaults, and an error wrapping
// [ErrInvalidOptions] for a negative olderThan.
func (p *Postgres) Prune(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	return p.outbox.Prune(ctx, olderThan, batch)
}
