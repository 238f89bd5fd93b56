package sqloutbox

import "errors"

// ErrBacklogUnsupported is returned by Backlog for an outbox whose
// Options.Schema or Options.Offsets is not the default one, whose tables
// it cannot read.
var ErrBacklogUnsupported = errors.New("sqloutbox: Backlog reads the tables of the default Schema and Offsets only")
