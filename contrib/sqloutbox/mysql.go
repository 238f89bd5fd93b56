package sqloutbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
)

// MySQL runs handlers in a transaction on MySQL or MariaDB that holds
// their own writes, their output messages (in the outbox table) and the
// completion of their idempotency key.
type MySQL struct {
	outbox
	sqldb *sql.DB
	store *mysqlstore.Store
}

// NewMySQL returns the outbox of store on db, which must reach the
// store's database. Call [MySQL.Migrate] once to create its tables.
func NewMySQL(db *sql.DB, store *mysqlstore.Store, opts Options) (*MySQL, error) {
	if db == nil || store == nil {
		return nil, fmt.Errorf("%w: nil database or store", ErrInvalidOptions)
	}
	// Not DefaultMySQLSchema: see Options.Schema.
	o, err := opts.withDefaults(wsql.MySQLQueueSchema{SubscribeBatchSize: 1}, wsql.MySQLQueueOffsetsAdapter{})
	if err != nil {
		return nil, err
	}
	return &MySQL{outbox: outbox{opts: o, db: wsql.BeginnerFromStdSQL(db)}, sqldb: db, store: store}, nil
}

// Migrate creates the outbox table and the Forwarder's offsets table if
// they do not exist. The store's own table is created by its Migrate.
func (m *MySQL) Migrate(ctx context.Context) error { return m.migrate(ctx) }

// SQLTx is the transaction a handler made by [MySQL.Handler] runs in: a
// *sql.Tx whose Commit and Rollback belong to the outbox, with Publish.
type SQLTx struct {
	*sql.Tx
	pub message.Publisher
}

// Publish writes msgs, bound for topic, into the outbox inside the
// transaction: they reach the broker (through the Forwarder) if and only
// if the transaction commits. Each keeps its UUID and metadata.
func (t *SQLTx) Publish(topic string, msgs ...*message.Message) error {
	return publish(t.pub, topic, msgs)
}

// Commit returns ErrOwnedTx: the outbox commits the transaction after the
// handler returns.
func (t *SQLTx) Commit() error { return ErrOwnedTx }

// Rollback returns ErrOwnedTx: return an error from the handler instead.
func (t *SQLTx) Rollback() error { return ErrOwnedTx }

// SQLHandlerFunc is a handler that writes its effects through tx and
// publishes its output with tx.Publish. It returns no messages: what it
// publishes goes through the outbox.
type SQLHandlerFunc func(tx *SQLTx, msg *message.Message) error

// Handler returns a handler for the router that begins a transaction,
// runs fn in it, completes the message's idempotency key in it (with no
// output to replay: the output is in the outbox), and commits. If fn
// fails, or the key can no longer be completed by this lease, the
// transaction rolls back and the handler fails. The idempotency
// middleware, with this outbox's store, must wrap the handler: without a
// lease it fails with ErrNoLease.
func (m *MySQL) Handler(fn SQLHandlerFunc) message.NoPublishHandlerFunc {
	return func(msg *message.Message) (err error) {
		l, err := lease(msg)
		if err != nil {
			return err
		}
		ctx := msg.Context()
		tx, err := m.sqldb.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("sqloutbox: begin: %w", err)
		}
		defer func() {
			if err != nil {
				if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
					err = errors.Join(err, fmt.Errorf("sqloutbox: rollback: %w", rerr))
				}
			}
		}()
		pub, err := m.publisher(wsql.TxFromStdSQL(tx))
		if err != nil {
			return err
		}
		if err := fn(&SQLTx{Tx: tx, pub: pub}, msg); err != nil {
			return err
		}
		if err := m.store.CompleteTx(ctx, tx, l, nil); err != nil {
			return err
		}
		beforeCommit()
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("sqloutbox: commit: %w", err)
		}
		return nil
	}
}

// NewForwarder returns the Forwarder that moves the outbox's messages to
// their destination topics through out, the real broker's publisher. See
// [Postgres.NewForwarder].
func (m *MySQL) NewForwarder(out message.Publisher, logger watermill.LoggerAdapter, cfg forwarder.Config) (*forwarder.Forwarder, error) {
	return m.newForwarder(out, logger, cfg)
}
