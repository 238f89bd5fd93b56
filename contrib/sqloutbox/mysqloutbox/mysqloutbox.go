// Package mysqloutbox is the transactional outbox of package sqloutbox on
// MySQL or MariaDB, with the mysqlstore store: a handler's business rows,
// its output messages and its key's completion commit in one
// transaction, and a Forwarder moves the messages to the broker. It is a
// package of its own so that a Postgres-only program, importing
// sqloutbox, links no MySQL driver. The guarantees, the costs and the
// retention are sqloutbox's (docs/outbox.md).
//
// # Use
//
//	outbox, err := mysqloutbox.New(db, store, mysqloutbox.Options{}) // db: *sql.DB, store: *mysqlstore.Store
//	...
//	charge := router.AddConsumerHandler("charge", "orders", sub, outbox.Handler(
//		func(tx *mysqloutbox.Tx, msg *message.Message) error {
//			if _, err := tx.ExecContext(msg.Context(), `INSERT INTO charges ...`, ...); err != nil {
//				return err
//			}
//			return tx.Publish("receipts", message.NewMessage(receiptID, payload))
//		}))
//	charge.AddMiddleware(idem.Middleware)
//	fwd, err := outbox.NewForwarder(brokerPublisher, logger, forwarder.Config{}) // its own router
//	go fwd.Run(ctx)
//
// # Outside a Watermill handler
//
// [Outbox.WithTx] is the same transaction for any work that runs under a
// lease: a function given to the middleware package's Do, an HTTP handler
// behind its Idempotency-Key door. It takes the lease from the context,
// runs the function, completes the key in the transaction with the output
// that door records for duplicates (middleware's CompletionOutput), and
// commits; the door sees the key completed by its own lease and does not
// complete it again. Handler is WithTx with the message's context.
//
//	_, err := idempotency.Do(ctx, idem, orderID, func(ctx context.Context) (struct{}, error) {
//		return struct{}{}, outbox.WithTx(ctx, func(tx *mysqloutbox.Tx) error { // Do's ctx: it holds the lease
//			if _, err := tx.ExecContext(ctx, `INSERT INTO refunds ...`, ...); err != nil {
//				return err
//			}
//			return tx.Publish("refunds", message.NewMessage("refund-"+orderID, payload))
//		})
//	})
package mysqloutbox

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/internal/outbox"
)

// DefaultTopic is the outbox topic [Options.Topic] defaults to: the
// watermill-sql topic the handlers write to and the Forwarder reads.
const DefaultTopic = outbox.DefaultTopic

// DefaultPollInterval is what [Options.PollInterval] defaults to: the
// Forwarder is woken by this process's commits, and polls for other
// processes' rows.
const DefaultPollInterval = outbox.DefaultPollInterval

// DefaultBatchSize is the number of rows the Forwarder reads per
// transaction with the default Options.Schema.
const DefaultBatchSize = 100

// DefaultPruneBatch is the number of rows Prune deletes per statement when
// given none.
const DefaultPruneBatch = outbox.DefaultPruneBatch

// The errors are the same values as package sqloutbox's: errors.Is
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
	// ErrInvalidOptions wraps every error of New about its options.
	ErrInvalidOptions = outbox.ErrInvalidOptions
	// ErrBacklogUnsupported is returned by Backlog for an outbox whose
	// Options.Schema or Options.Offsets is not the default one, whose
	// tables it cannot read.
	ErrBacklogUnsupported = outbox.ErrBacklogUnsupported
	// ErrPruneUnsupported is returned by Prune for an outbox whose
	// Options.Schema or Options.Offsets is not the default one.
	ErrPruneUnsupported = outbox.ErrPruneUnsupported
)

// Options configures a MySQL outbox. The zero value is ready to use.
type Options struct {
	// Topic is the watermill-sql topic of the outbox: handlers write
	// enveloped messages to it, the Forwarder reads them. With
	// watermill-sql's schemas its table is "watermill_" + Topic.
	// Defaults to DefaultTopic.
	Topic string
	// Schema is the watermill-sql schema adapter of the outbox table; the
	// Forwarder's subscriber uses the same. Defaults to MySQLQueueSchema
	// reading DefaultBatchSize rows per transaction. Not
	// DefaultMySQLSchema: it reads rows past the last forwarded
	// AUTO_INCREMENT offset, and a transaction that took a lower offset
	// but commits after a higher one has been forwarded is skipped, its
	// messages never forwarded (the storm test saw it).
	//
	// With MySQLQueueSchema and MySQLQueueOffsetsAdapter the Forwarder
	// differs from watermill-sql's subscriber in two ways (docs/outbox.md):
	// it reads at READ COMMITTED, so that writers do not wait for its
	// batch, and a batch cut short marks forwarded only the rows it
	// forwarded (watermill-sql v4.1.2 marks the whole batch).
	Schema wsql.SchemaAdapter
	// Offsets is the watermill-sql offsets adapter of the Forwarder's
	// subscriber. Defaults to MySQLQueueOffsetsAdapter (forwarded rows are
	// marked acked; DeleteOnAck deletes them instead).
	Offsets wsql.OffsetsAdapter
	// Marshaler encodes the envelopes that carry each message and its
	// destination topic. Defaults to the Forwarder's DefaultMarshaler
	// (JSON).
	Marshaler forwarder.Marshaler
	// PollInterval is how long the Forwarder waits, when it found no new
	// row, before it reads the table again unless a commit of this
	// process to the outbox wakes it: rows that other processes commit
	// are found within it. Defaults to DefaultPollInterval.
	PollInterval time.Duration
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

// Outbox runs work in a transaction on MySQL or MariaDB that holds its own
// writes, its output messages (in the outbox table) and the completion of
// its idempotency key: a Watermill handler ([Outbox.Handler]), or any work
// that runs under a lease ([Outbox.WithTx]).
type Outbox struct {
	outbox *outbox.Outbox
	db     *sql.DB
	store  *mysqlstore.Store
}

// New returns the outbox of store on db, which must reach the store's
// database. Call [Outbox.Migrate] once to create its tables.
//
// A nil db is refused with an error wrapping backends.ErrNilClient, as a
// store's constructor refuses a nil client, and [ErrInvalidOptions]; a nil
// store with an error wrapping ErrInvalidOptions, as the middleware
// refuses one.
func New(db *sql.DB, store *mysqlstore.Store, opts Options) (*Outbox, error) {
	if err := outbox.CheckClients(db, store); err != nil {
		return nil, err
	}
	cfg := outbox.Config{Topic: opts.Topic, Schema: opts.Schema, Offsets: opts.Offsets, Marshaler: opts.Marshaler, PollInterval: opts.PollInterval, Retention: opts.Retention}
	// Not DefaultMySQLSchema: see Options.Schema.
	o, err := outbox.New(wsql.BeginnerFromStdSQL(db), db, cfg, wsql.MySQLQueueSchema{SubscribeBatchSize: DefaultBatchSize}, wsql.MySQLQueueOffsetsAdapter{})
	if err != nil {
		return nil, err
	}
	return &Outbox{outbox: o, db: db, store: store}, nil
}

// Migrate creates the outbox table and the Forwarder's offsets table if
// they do not exist. The store's own table is created by its Migrate.
func (m *Outbox) Migrate(ctx context.Context) error { return m.outbox.Migrate(ctx, nil, nil) }

// Tx is the transaction a function given to [Outbox.WithTx] (or a
// handler made by [Outbox.Handler]) runs in: a *sql.Tx whose Commit and
// Rollback belong to the outbox, with Publish.
type Tx struct {
	*sql.Tx
	pub message.Publisher
}

// Publish writes msgs, bound for topic, into the outbox inside the
// transaction: they reach the broker (through the Forwarder) if and only
// if the transaction commits. Each keeps its UUID and metadata.
func (t *Tx) Publish(topic string, msgs ...*message.Message) error {
	return outbox.Publish(t.pub, topic, msgs)
}

// Commit returns ErrOwnedTx: the outbox commits the transaction after the
// function returns.
func (t *Tx) Commit() error { return ErrOwnedTx }

// Rollback returns ErrOwnedTx: return an error from the function instead.
func (t *Tx) Rollback() error { return ErrOwnedTx }

// WithTx runs fn in a transaction that holds its own writes (through tx),
// its output messages (tx.Publish, into the outbox table) and the
// completion of the idempotency key whose lease ctx carries; it commits
// them together, or none of them. Use it in work that runs under a lease
// outside a Watermill handler: a function given to the middleware
// package's Do (pass WithTx the context Do gives the function), or an HTTP
// handler behind the middleware's Idempotency-Key door. The key is
// completed with the output that door records for duplicates
// (middleware.CompletionOutput: none for Do, whose duplicates get the zero
// value of its result), and the door does not complete it again.
//
// It begins a transaction on the outbox's database, runs fn, completes
// the key in the transaction (mysqlstore.Store.CompleteTxOutput), and
// commits. If fn fails or panics, or the key can no longer be completed by
// this lease (an error wrapping backends.ErrLeaseLost), or the server
// reports a deadlock or a lock wait timeout, the transaction rolls back
// and WithTx returns the error: nothing of it was recorded, and the door
// releases the key for a retry. Without a lease in ctx (the work does not
// run under the middleware, Do or another door) it returns [ErrNoLease]
// and runs nothing. The lease must be of this outbox's store.
func (m *Outbox) WithTx(ctx context.Context, fn func(tx *Tx) error) error {
	return outbox.WithTx(ctx, m.outbox, m.begin, func(tx sqlTx, pub message.Publisher) error {
		return fn(&Tx{Tx: tx.tx, pub: pub})
	})
}

// HandlerFunc is a handler that writes its effects through tx and
// publishes its output with tx.Publish. It returns no messages: what it
// publishes goes through the outbox.
type HandlerFunc func(tx *Tx, msg *message.Message) error

// Handler returns a handler for the router that runs fn through
// [Outbox.WithTx], with the message's context: one transaction holds fn's
// writes, its output messages and the completion of the message's
// idempotency key (with no output to replay: the output is in the
// outbox). If fn fails, or the key can no longer be completed by this
// lease, the transaction rolls back and the handler fails: nothing of it
// was recorded. The idempotency middleware, with this outbox's store,
// must wrap the handler: without a lease it fails with ErrNoLease.
func (m *Outbox) Handler(fn HandlerFunc) message.NoPublishHandlerFunc {
	return outbox.Handler(m.WithTx, fn)
}

// sqlTx is a transaction of the outbox's database, as the shared
// outbox.WithTx drives it.
type sqlTx struct {
	tx    *sql.Tx
	store *mysqlstore.Store
}

func (m *Outbox) begin(ctx context.Context) (sqlTx, error) {
	tx, err := m.db.BeginTx(ctx, nil)
	return sqlTx{tx: tx, store: m.store}, err
}

func (t sqlTx) Executor() wsql.ContextExecutor { return wsql.TxFromStdSQL(t.tx) }

func (t sqlTx) Complete(ctx context.Context, lease backends.Lease, output []byte) error {
	return t.store.CompleteTxOutput(ctx, t.tx, lease, output)
}

func (t sqlTx) Commit(context.Context) error { return t.tx.Commit() }

func (t sqlTx) Rollback(context.Context) error {
	if err := t.tx.Rollback(); !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// NewForwarder returns the Forwarder that moves the outbox's messages to
// their destination topics through out, the real broker's publisher. Run
// it (Run, or the Router of cfg) in the service, in as many copies as
// wanted: they share the outbox's consumer group, and one forwards at a
// time. Leave cfg's ForwarderTopic and Marshaler unset: the outbox's
// Options set both.
//
// The Forwarder reads the outbox table as soon as a WithTx or Handler of
// this process commits rows to it (every Forwarder of the outbox's topic
// in the process is woken), and every Options.PollInterval otherwise:
// MySQL has no notification a transaction can send at its commit, so rows
// that other processes commit are found within the poll interval.
func (m *Outbox) NewForwarder(out message.Publisher, logger watermill.LoggerAdapter, cfg forwarder.Config) (*forwarder.Forwarder, error) {
	return m.outbox.NewForwarder(out, logger, cfg, nil)
}

// Prune deletes the outbox rows the Forwarder has marked forwarded
// (acked) that are older than olderThan, by the database's clock, and
// returns how many it deleted. It deletes at most batch rows
// (DefaultPruneBatch if batch is not positive) per statement, each a short
// transaction of its own that locks only forwarded rows, until a statement
// deletes fewer: writers and the Forwarder go on meanwhile. A row not yet
// forwarded is never deleted. Call it from a periodic job; or set
// Options.Offsets to wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: true} to
// delete each row as it is forwarded (Prune then finds none to delete).
//
// It returns [ErrPruneUnsupported] unless Options.Schema and
// Options.Offsets are the defaults, and an error wrapping
// [ErrInvalidOptions] for a negative olderThan.
func (m *Outbox) Prune(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	return m.outbox.Prune(ctx, olderThan, batch)
}

// Backlog returns how many messages wait in the outbox for the Forwarder
// (rows not marked forwarded), and how long the oldest of them has
// waited, by the database's clock (zero if none does). It scans the
// outbox table, as each read of the Forwarder does: prune forwarded rows
// (docs/outbox.md) to keep both short. It implements contrib/idemotel's
// OutboxBacklog, for the outbox gauges.
//
// It returns [ErrBacklogUnsupported] unless Options.Schema and
// Options.Offsets are the defaults.
func (m *Outbox) Backlog(ctx context.Context) (messages int64, oldest time.Duration, err error) {
	return m.outbox.Backlog(ctx)
}
