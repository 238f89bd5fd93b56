package pgstore

import (
	"time"

	"github.com/jackc/pgx/v5"
)

// StateReleased is the state column's code of a released lease.
const StateReleased = stateReleased

// SetListenIdle makes the listeners of stores created from now on ping
// their connection after d of silence, until restore is called.
func SetListenIdle(d time.Duration) (restore func()) {
	old := listenIdle
	listenIdle = d
	return func() { listenIdle = old }
}

// Channel is the channel on which the store's statements notify a key's
// watchers, and which its listener listens to.
func Channel(s *Store) string { return s.channel }

// Queued returns how many calls wait in the store's batcher for a batch
// to come back.
func Queued(s *Store) int {
	return s.batcher.calls.Queued()
}

// AcquireFunction is the quoted, schema-qualified name of the store's
// acquire function, as its Acquire statement calls it.
func AcquireFunction(s *Store) string {
	return pgx.Identifier{s.opts.Schema, s.opts.Table + acquireSuffix}.Sanitize()
}

// FunctionBody is the body of the acquire function this version creates.
func FunctionBody(s *Store) string { return functionBody(s.sql.functions) }
