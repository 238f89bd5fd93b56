package sqloutbox

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/internal/outbox"
)

// PgxDB is what a Postgres outbox needs of the database: a *pgxpool.Pool
// satisfies it. It must reach the database of the store's table.
type PgxDB interface {
	wsql.Conn
}

// Postgres runs work in a transaction on Postgres that holds its own
// writes, its output messages (in the outbox table) and the completion of
// its idempotency key: a Watermill handler ([Postgres.Handler]), or any
// work that runs under a lease ([Postgres.WithTx]).
type Postgres struct {
	outbox *outbox.Outbox
	conn   PgxDB
	store  *pgstore.Store
	table  string // the outbox table, for its trigger; "" if the schema does not say
	ch     string // its notification channel
	listen bool
}

// NewPostgres returns the outbox of store on db, which must reach the
// store's database. Call [Postgres.Migrate] once to create its tables.
//
// A nil db, or a typed nil one (a nil *pgxpool.Pool), is refused with an
// error wrapping backends.ErrNilClient, as a store's constructor refuses a
// nil client, and [ErrInvalidOptions]; a nil store with an error wrapping
// ErrInvalidOptions, as the middleware refuses one.
func NewPostgres(db PgxDB, store *pgstore.Store, opts Options) (*Postgres, error) {
	if err := outbox.CheckClients(db, store); err != nil {
		return nil, err
	}
	o, err := outbox.New(wsql.BeginnerFromPgx(db), db, opts.config(), wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{})
	if err != nil {
		return nil, err
	}
	p := &Postgres{outbox: o, conn: db, store: store, ch: channel(o.Topic()), listen: !opts.NoListen}
	if t, ok := o.Schema().(interface{ MessagesTable(string) string }); ok {
		p.table = t.MessagesTable(o.Topic())
	}
	return p, nil
}

// Migrate creates the outbox table and the Forwarder's offsets table if
// they do not exist, and the trigger that notifies the Forwarder of the
// rows each transaction commits (function sqloutbox_notify, trigger
// sqloutbox_notify on the outbox table). Run it again after an upgrade
// from a version without the trigger: it creates what is missing only.
// The store's own table is created by its Migrate.
func (p *Postgres) Migrate(ctx context.Context) error {
	var after []string
	if p.table != "" {
		after = []string{notifyFunction, notifyTrigger(p.table, p.ch)}
	}
	return p.outbox.Migrate(ctx, []string{migrateLock}, after)
}

// PgxTx is the transaction a function given to [Postgres.WithTx] (or a
// handler made by [Postgres.Handler]) runs in: a pgx.Tx whose Commit and
// Rollback belong to the outbox, with Publish.
type PgxTx struct {
	pgx.Tx
	pub message.Publisher
}

// Publish writes msgs, bound for topic, into the outbox inside the
// transaction: they reach the broker (through the Forwarder) if and only
// if the transaction commits. Each keeps its UUID and metadata.
func (t *PgxTx) Publish(topic string, msgs ...*message.Message) error {
	return outbox.Publish(t.pub, topic, msgs)
}

// Commit returns ErrOwnedTx: the outbox commits the transaction after the
// function returns.
func (t *PgxTx) Commit(context.Context) error { return ErrOwnedTx }

// Rollback returns ErrOwnedTx: return an error from the function instead.
func (t *PgxTx) Rollback(context.Context) error { return ErrOwnedTx }

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
// the key in the transaction (pgstore.Store.CompleteTxOutput), and
// commits. If fn fails or panics, or the key can no longer be completed by
// this lease (an error wrapping backends.ErrLeaseLost), the transaction
// rolls back and WithTx returns the error: nothing of it was recorded,
// and the door releases the key for a retry. Without a lease in ctx (the
// work does not run under the middleware, Do or another door) it returns
// [ErrNoLease] and runs nothing. The lease must be of this outbox's store.
func (p *Postgres) WithTx(ctx context.Context, fn func(tx *PgxTx) error) error {
	return outbox.WithTx(ctx, p.outbox, p.begin, func(tx pgTx, pub message.Publisher) error {
		return fn(&PgxTx{Tx: tx.tx, pub: pub})
	})
}

// PgxHandlerFunc is a handler that writes its effects through tx and
// publishes its output with tx.Publish. It returns no messages: what it
// publishes goes through the outbox.
type PgxHandlerFunc func(tx *PgxTx, msg *message.Message) error

// Handler returns a handler for the router that runs fn through
// [Postgres.WithTx], with the message's context: one transaction holds
// fn's writes, its output messages and the completion of the message's
// idempotency key (with no output to replay: the output is in the
// outbox). If fn fails, or the key can no longer be completed by this
// lease, the transaction rolls back and the handler fails: nothing of it
// was recorded. The idempotency middleware, with this outbox's store,
// must wrap the handler (router.AddMiddleware or idem.Middleware around
// it): without a lease it fails with ErrNoLease.
func (p *Postgres) Handler(fn PgxHandlerFunc) message.NoPublishHandlerFunc {
	return outbox.Handler(p.WithTx, fn)
}

// pgTx is a transaction of the outbox's database, as the shared
// outbox.WithTx drives it.
type pgTx struct {
	tx    pgx.Tx
	store *pgstore.Store
}

func (p *Postgres) begin(ctx context.Context) (pgTx, error) {
	var opts pgx.TxOptions
	if p.outbox.Forwarding() {
		// The commit wakes this process's Forwarder: the trigger need
		// not notify (a notifying commit takes a lock every notifying
		// commit on the server waits for).
		opts.BeginQuery = quietBegin
	}
	tx, err := p.conn.BeginTx(ctx, opts)
	return pgTx{tx: tx, store: p.store}, err
}

func (t pgTx) Executor() wsql.ContextExecutor { return wsql.TxFromPgx(t.tx) }

func (t pgTx) Complete(ctx context.Context, lease backends.Lease, output []byte) error {
	return t.store.CompleteTxOutput(ctx, t.tx, lease, output)
}

func (t pgTx) Commit(ctx context.Context) error { return t.tx.Commit(ctx) }

func (t pgTx) Rollback(ctx context.Context) error {
	if err := t.tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
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
// The Forwarder reads the outbox table as soon as a transaction that
// wrote to it commits: woken at once by this process's WithTx and
// Handler, and by a Postgres notification for every other writer (the
// trigger Migrate creates), which it hears on a connection of its own,
// taken out of db when db is a *pgxpool.Pool (unless Options.NoListen).
// It also reads every Options.PollInterval, which bounds the delay when a
// notification is lost or its connection is being made again.
func (p *Postgres) NewForwarder(out message.Publisher, logger watermill.LoggerAdapter, cfg forwarder.Config) (*forwarder.Forwarder, error) {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	var l outbox.Listener
	if pool, ok := p.conn.(acquirer); ok && p.listen && p.table != "" {
		l = func(ctx context.Context, wake func()) { listen(ctx, pool, p.ch, wake, logger) }
	}
	return p.outbox.NewForwarder(out, logger, cfg, l)
}
