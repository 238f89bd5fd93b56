package sqloutbox

import (
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"

	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/internal/outbox"
)

// DefaultTopic is the outbox topic [Options.Topic] defaults to: the
// watermill-sql topic the handlers write to and the Forwarder reads.
const DefaultTopic = outbox.DefaultTopic

// DefaultPollInterval is what [Options.PollInterval] defaults to: the
// Forwarder is woken when rows commit, and polls only for what a wake
// missed.
const DefaultPollInterval = outbox.DefaultPollInterval

// The errors are the same values in package mysqloutbox: errors.Is
// matches either package's.
var (
	// ErrNoLease is returned by WithTx when its context carries no lease
	// (the work does not run under the idempotency middleware, Do or
	// another of its doors), and by a handler made by Handler when the
	// message's does (the middleware does not wrap it).
	ErrNoLease = outbox.ErrNoLease
	// ErrOwnedTx is returned by Commit and Rollback on the transaction a
	// function or handler is given: the outbox commits it after the
	// function returns (and rolls it back if the function fails).
	ErrOwnedTx = outbox.ErrOwnedTx
	// ErrInvalidOptions wraps every error of a constructor about its
	// options.
	ErrInvalidOptions = outbox.ErrInvalidOptions
)

// Options configures a Postgres outbox. The zero value is ready to use.
type Options struct {
	// Topic is the watermill-sql topic of the outbox: handlers write
	// enveloped messages to it, the Forwarder reads them. With
	// watermill-sql's default schemas its table is "watermill_" + Topic.
	// Defaults to DefaultTopic.
	Topic string
	// Schema is the watermill-sql schema adapter of the outbox table; the
	// Forwarder's subscriber uses the same. Defaults to
	// DefaultPostgreSQLSchema.
	Schema wsql.SchemaAdapter
	// Offsets is the watermill-sql offsets adapter of the Forwarder's
	// subscriber. Defaults to DefaultPostgreSQLOffsetsAdapter.
	Offsets wsql.OffsetsAdapter
	// Marshaler encodes the envelopes that carry each message and its
	// destination topic. Defaults to the Forwarder's DefaultMarshaler
	// (JSON).
	Marshaler forwarder.Marshaler
	// PollInterval is how long the Forwarder waits, when it found no new
	// row, before it reads the table again unless something wakes it: a
	// commit of this process to the outbox, or a notification of another
	// writer's. It bounds the delay of rows whose wake was lost. Defaults
	// to DefaultPollInterval.
	PollInterval time.Duration
	// NoListen stops the Forwarder from listening for the notifications
	// of other writers' commits: set it when the database is reached
	// through a pooler in transaction mode (PgBouncer), where LISTEN does
	// not work. The Forwarder is then woken by this process's commits
	// only, and finds other writers' rows within PollInterval.
	NoListen bool
	// Retention, if positive, makes each Forwarder delete the rows it has
	// forwarded once they are older than Retention, by the database's
	// clock: Prune, with DefaultPruneBatch rows per statement, every
	// Retention (at least every minute, at most every second) while the
	// Forwarder runs; a failure is logged and tried again at the next
	// round. Zero keeps every row: call Prune from a job of your own, or
	// not at all. It needs the default Schema and Offsets (the
	// constructor says so otherwise).
	Retention time.Duration
}

func (o Options) config() outbox.Config {
	return outbox.Config{Topic: o.Topic, Schema: o.Schema, Offsets: o.Offsets, Marshaler: o.Marshaler, PollInterval: o.PollInterval, Retention: o.Retention}
}
