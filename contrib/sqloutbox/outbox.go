package sqloutbox

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
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// DefaultTopic is the outbox topic [Options.Topic] defaults to: the
// watermill-sql topic the handlers write to and the Forwarder reads.
const DefaultTopic = "outbox"

// DefaultPollInterval is what [Options.PollInterval] defaults to.
const DefaultPollInterval = 100 * time.Millisecond

var (
	// ErrNoLease is returned by a handler made by Handler when the message
	// carries no lease: the idempotency middleware does not wrap it.
	ErrNoLease = errors.New("sqloutbox: no lease in the message context: the idempotency middleware must wrap the handler")
	// ErrOwnedTx is returned by Commit and Rollback on the transaction a
	// handler is given: the outbox commits it after the handler returns
	// (and rolls it back if the handler fails).
	ErrOwnedTx = errors.New("sqloutbox: the handler's transaction is committed or rolled back by the outbox")
	// ErrInvalidOptions wraps every error of a constructor about its
	// options.
	ErrInvalidOptions = errors.New("sqloutbox: invalid options")
)

// Options configures an outbox. The zero value is ready to use.
type Options struct {
	// Topic is the watermill-sql topic of the outbox: handlers write
	// enveloped messages to it, the Forwarder reads them. With
	// watermill-sql's default schemas its table is "watermill_" + Topic.
	// Defaults to DefaultTopic.
	Topic string
	// Schema is the watermill-sql schema adapter of the outbox table; the
	// Forwarder's subscriber uses the same. Defaults to
	// DefaultPostgreSQLSchema on Postgres, and on MySQL to
	// MySQLQueueSchema reading one row at a time. Not DefaultMySQLSchema
	// on MySQL: it reads rows past the last forwarded AUTO_INCREMENT
	// offset, and a transaction that took a lower offset but commits
	// after a higher one has been forwarded is skipped, its messages never
	// forwarded (the storm test saw it). Not MySQLQueueSchema with a batch
	// of more than one row: when the Forwarder stops or its publish times
	// out mid-batch, watermill-sql v4.1.2 marks every row of the batch
	// forwarded, the unsent ones too.
	Schema wsql.SchemaAdapter
	// Offsets is the watermill-sql offsets adapter of the Forwarder's
	// subscriber. Defaults to DefaultPostgreSQLOffsetsAdapter on Postgres
	// and MySQLQueueOffsetsAdapter on MySQL (forwarded rows are marked
	// acked; DeleteOnAck deletes them instead).
	Offsets wsql.OffsetsAdapter
	// Marshaler encodes the envelopes that carry each message and its
	// destination topic. Defaults to the Forwarder's DefaultMarshaler
	// (JSON).
	Marshaler forwarder.Marshaler
	// PollInterval is how long the Forwarder's subscriber waits before it
	// looks again when it found no new row. Defaults to
	// DefaultPollInterval.
	PollInterval time.Duration
}

func (o Options) withDefaults(schema wsql.SchemaAdapter, offsets wsql.OffsetsAdapter) (Options, error) {
	if o.Topic == "" {
		o.Topic = DefaultTopic
	}
	if o.Schema == nil {
		o.Schema = schema
	}
	if o.Offsets == nil {
		o.Offsets = offsets
	}
	if o.Marshaler == nil {
		o.Marshaler = forwarder.DefaultMarshaler{}
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.PollInterval < 0 {
		return o, fmt.Errorf("%w: PollInterval must not be negative, got %v", ErrInvalidOptions, o.PollInterval)
	}
	return o, nil
}

// beforeCommit runs after a handler's key is completed in its transaction
// and before the commit: the tests' crash point there.
var beforeCommit = func() {}

// outbox is what the Postgres and MySQL outboxes share.
type outbox struct {
	opts Options
	db   wsql.Beginner
}

// publisher publishes enveloped messages into the outbox table through
// exec, the handler's transaction.
func (o *outbox) publisher(exec wsql.ContextExecutor) (message.Publisher, error) {
	pub, err := wsql.NewPublisher(exec, wsql.PublisherConfig{SchemaAdapter: o.opts.Schema}, nil)
	if err != nil {
		return nil, fmt.Errorf("sqloutbox: %w", err)
	}
	return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: o.opts.Topic, Marshaler: o.opts.Marshaler}), nil
}

// publish writes msgs, bound for topic, through pub.
func publish(pub message.Publisher, topic string, msgs []*message.Message) error {
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

// lease returns the lease the message's handler runs under.
func lease(msg *message.Message) (backends.Lease, error) {
	l, ok := idempotency.LeaseFromContext(msg.Context())
	if !ok {
		return backends.Lease{}, ErrNoLease
	}
	return l, nil
}

// migrate creates the outbox table and the Forwarder's offsets table if
// they do not exist, in one transaction on db.
func (o *outbox) migrate(ctx context.Context) error {
	qs, err := o.opts.Schema.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: o.opts.Topic})
	if err != nil {
		return fmt.Errorf("sqloutbox: migrate: %w", err)
	}
	oqs, err := o.opts.Offsets.SchemaInitializingQueries(wsql.OffsetsSchemaInitializingQueriesParams{Topic: o.opts.Topic})
	if err != nil {
		return fmt.Errorf("sqloutbox: migrate: %w", err)
	}
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqloutbox: migrate: %w", err)
	}
	for _, q := range append(qs, oqs...) {
		if _, err := tx.ExecContext(ctx, q.Query, q.Args...); err != nil {
			return errors.Join(fmt.Errorf("sqloutbox: migrate: %w", err), tx.Rollback())
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqloutbox: migrate: %w", err)
	}
	return nil
}

// newForwarder makes the Forwarder that reads the outbox through db and
// publishes each message to its destination topic through out.
func (o *outbox) newForwarder(out message.Publisher, logger watermill.LoggerAdapter, cfg forwarder.Config) (*forwarder.Forwarder, error) {
	if out == nil {
		return nil, fmt.Errorf("%w: nil publisher", ErrInvalidOptions)
	}
	if cfg.ForwarderTopic != "" && cfg.ForwarderTopic != o.opts.Topic {
		return nil, fmt.Errorf("%w: the Forwarder's topic %q is not the outbox's %q", ErrInvalidOptions, cfg.ForwarderTopic, o.opts.Topic)
	}
	if cfg.Marshaler != nil {
		return nil, fmt.Errorf("%w: set the Marshaler in Options, for the outbox and its Forwarder alike", ErrInvalidOptions)
	}
	cfg.ForwarderTopic, cfg.Marshaler = o.opts.Topic, o.opts.Marshaler
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	sub, err := wsql.NewSubscriber(o.db, wsql.SubscriberConfig{
		SchemaAdapter:  o.opts.Schema,
		OffsetsAdapter: o.opts.Offsets,
		PollInterval:   o.opts.PollInterval,
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("sqloutbox: forwarder: %w", err)
	}
	f, err := forwarder.NewForwarder(sub, out, logger, cfg)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("sqloutbox: forwarder: %w", err), sub.Close())
	}
	return f, nil
}
