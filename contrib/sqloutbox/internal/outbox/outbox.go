// Package outbox is what the Postgres outbox (package sqloutbox) and the
// MySQL one (package mysqloutbox) share: the transaction that holds the
// work's rows, its messages and its key's completion ([WithTx]); the
// outbox table, written through watermill-sql on that transaction; and
// the Forwarder that reads it. It imports no database driver, so that each outbox package links
// only its own.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// DefaultTopic is the outbox topic a zero Config.Topic means.
const DefaultTopic = "outbox"

// DefaultPollInterval is what a zero Config.PollInterval means.
const DefaultPollInterval = time.Second

// The errors both outbox packages return (and export under the same
// names).
var (
	ErrNoLease        = errors.New("sqloutbox: no lease in the context: run under the idempotency middleware, Do, or another of its doors")
	ErrOwnedTx        = errors.New("sqloutbox: the handler's transaction is committed or rolled back by the outbox")
	ErrInvalidOptions = errors.New("sqloutbox: invalid options")
)

// Config is an outbox's options, as both packages' Options hold them.
type Config struct {
	Topic        string
	Schema       wsql.SchemaAdapter
	Offsets      wsql.OffsetsAdapter
	Marshaler    forwarder.Marshaler
	PollInterval time.Duration
	Retention    time.Duration
}

// BeforeCommit runs after a handler's key is completed in its transaction
// and before the commit: the tests' crash point there.
var BeforeCommit = func() {}

// Outbox is the outbox table of one topic on one database.
type Outbox struct {
	cfg Config
	db  wsql.Beginner
	key wakeKey // its Forwarders in the process
}

// CheckClients is what both packages' constructors check first. A nil
// database, or a typed nil one (a nil *pgxpool.Pool as a PgxDB), is an
// error wrapping backends.ErrNilClient, as every store's constructor
// returns for a nil client, and ErrInvalidOptions, which it wrapped
// before. A nil store is an error wrapping ErrInvalidOptions only: the
// outbox uses the store as the middleware does, which refuses a nil one
// as a configuration error.
func CheckClients(db, store any) error {
	if storekit.IsNil(db) {
		return fmt.Errorf("%w: nil database: %w", ErrInvalidOptions, backends.ErrNilClient)
	}
	if storekit.IsNil(store) {
		return fmt.Errorf("%w: nil store", ErrInvalidOptions)
	}
	return nil
}

// New returns the outbox of cfg on db; schema and offsets are the
// database's defaults for cfg's unset Schema and Offsets. conn is the
// connection pool db wraps, which tells the outbox's Forwarders in the
// process apart from those of another database's outbox of the same
// topic.
func New(db wsql.Beginner, conn any, cfg Config, schema wsql.SchemaAdapter, offsets wsql.OffsetsAdapter) (*Outbox, error) {
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if cfg.Schema == nil {
		cfg.Schema = schema
	}
	if cfg.Offsets == nil {
		cfg.Offsets = offsets
	}
	if cfg.Marshaler == nil {
		cfg.Marshaler = forwarder.DefaultMarshaler{}
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.PollInterval < 0 {
		return nil, fmt.Errorf("%w: PollInterval must not be negative, got %v", ErrInvalidOptions, cfg.PollInterval)
	}
	o := &Outbox{cfg: cfg, db: db, key: newWakeKey(conn, cfg.Topic)}
	if cfg.Retention < 0 {
		return nil, fmt.Errorf("%w: Retention must not be negative, got %v", ErrInvalidOptions, cfg.Retention)
	}
	if _, err := o.pruneQuery(); cfg.Retention > 0 && err != nil {
		return nil, fmt.Errorf("%w: Retention: %w", ErrInvalidOptions, err)
	}
	return o, nil
}

// Publisher publishes enveloped messages into the outbox table through
// exec, the handler's transaction.
func (o *Outbox) Publisher(exec wsql.ContextExecutor) (message.Publisher, error) {
	pub, err := wsql.NewPublisher(exec, wsql.PublisherConfig{SchemaAdapter: o.cfg.Schema}, nil)
	if err != nil {
		return nil, fmt.Errorf("sqloutbox: %w", err)
	}
	return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: o.cfg.Topic, Marshaler: o.cfg.Marshaler}), nil
}

// Publish writes msgs, bound for topic, through pub.
func Publish(pub message.Publisher, topic string, msgs []*message.Message) error {
	if topic == "" {
		return errors.New("sqloutbox: publish: empty destination topic")
	}
	if len(msgs) == 0 {
		return nil
	}
	if err := pub.Publish(topic, msgs...); err != nil {
		return fmt.Errorf("sqloutbox: publish to %q through the outbox: %w", topic, err)
	}
	return nil
}

// Migrate creates the outbox table and the Forwarder's offsets table if
// they do not exist, in one transaction, between the statements of before
// and after.
func (o *Outbox) Migrate(ctx context.Context, before, after []string) error {
	qs, err := o.cfg.Schema.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: o.cfg.Topic})
	if err != nil {
		return fmt.Errorf("sqloutbox: migrate: %w", err)
	}
	oqs, err := o.cfg.Offsets.SchemaInitializingQueries(wsql.OffsetsSchemaInitializingQueriesParams{Topic: o.cfg.Topic})
	if err != nil {
		return fmt.Errorf("sqloutbox: migrate: %w", err)
	}
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqloutbox: migrate: %w", err)
	}
	all := wrap(before)
	all = append(append(append(all, qs...), oqs...), wrap(after)...)
	for _, q := range all {
		if _, err := tx.ExecContext(ctx, q.Query, q.Args...); err != nil {
			return errors.Join(fmt.Errorf("sqloutbox: migrate: %w", err), tx.Rollback())
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqloutbox: migrate: %w", err)
	}
	return nil
}

func wrap(qs []string) []wsql.Query {
	out := make([]wsql.Query, len(qs))
	for i, q := range qs {
		out[i] = wsql.Query{Query: q}
	}
	return out
}

// NewForwarder makes the Forwarder that reads the outbox and publishes
// each message to its destination topic through out. It is woken by this
// process's commits to the outbox and, if listen is not nil, by what
// listen hears; it reads every PollInterval otherwise.
func (o *Outbox) NewForwarder(out message.Publisher, logger watermill.LoggerAdapter, cfg forwarder.Config, listen Listener) (*forwarder.Forwarder, error) {
	if out == nil {
		return nil, fmt.Errorf("%w: nil publisher", ErrInvalidOptions)
	}
	if cfg.ForwarderTopic != "" && cfg.ForwarderTopic != o.cfg.Topic {
		return nil, fmt.Errorf("%w: the Forwarder's topic %q is not the outbox's %q", ErrInvalidOptions, cfg.ForwarderTopic, o.cfg.Topic)
	}
	if cfg.Marshaler != nil {
		return nil, fmt.Errorf("%w: set the Marshaler in Options, for the outbox and its Forwarder alike", ErrInvalidOptions)
	}
	cfg.ForwarderTopic, cfg.Marshaler = o.cfg.Topic, o.cfg.Marshaler
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	w := newWaker(o.cfg.PollInterval)
	schema, offsets := forwarderAdapters(o.cfg.Schema, o.cfg.Offsets)
	inner, err := wsql.NewSubscriber(o.db, wsql.SubscriberConfig{
		SchemaAdapter:  schema,
		OffsetsAdapter: offsets,
		PollInterval:   o.cfg.PollInterval,
		BackoffManager: w,
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("sqloutbox: forwarder: %w", err)
	}
	sub := &wokenSubscriber{Subscriber: inner, key: o.key, w: w, listen: listen}
	if o.cfg.Retention > 0 {
		sub.prune = func(ctx context.Context) { o.pruneLoop(ctx, logger) }
	}
	f, err := forwarder.NewForwarder(sub, out, logger, cfg)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("sqloutbox: forwarder: %w", err), sub.Close())
	}
	return f, nil
}

// Topic is the outbox's topic.
func (o *Outbox) Topic() string { return o.cfg.Topic }

// Schema is the outbox table's schema adapter.
func (o *Outbox) Schema() wsql.SchemaAdapter { return o.cfg.Schema }
