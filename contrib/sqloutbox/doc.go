// Package sqloutbox publishes a handler's output messages exactly once,
// through a transactional outbox, on Postgres (pgstore); work outside a
// Watermill handler, such as a function run by the middleware package's
// Do, does the same with [Postgres.WithTx]. Its package
// mysqloutbox does the same on MySQL or MariaDB (mysqlstore): a package of
// its own, so that a Postgres-only program links no MySQL driver.
//
// Without it, the idempotency middleware stores a handler's produced
// messages with its key's completion and the router publishes them after
// the handler returns; every redelivery of the completed key publishes
// them again. With it, the handler writes its business rows, its output
// messages and its key's completion in one database transaction, and
// returns nothing for the router to publish:
//
//   - the output rows go to an outbox table through watermill-sql's
//     publisher on that transaction, each in an envelope naming its
//     destination topic (Watermill's components/forwarder format);
//   - the completion records no output, so a redelivery of the completed
//     key publishes nothing again;
//   - a Forwarder run by the service reads the outbox table and publishes
//     each message to its destination on the real broker, at least once,
//     always with the message's own UUID. It reads as soon as rows commit:
//     woken by this process's commits, and on Postgres by a notification
//     of every writer's (a trigger Migrate creates); it polls every
//     PollInterval only for a wake that was missed.
//
// If the transaction commits, the business rows, the outputs and the
// completion are recorded together, once; if it rolls back, none is, and
// the message is redelivered and run again. A downstream consumer that
// uses the idempotency middleware keyed by message UUID applies each
// output once. Prune deletes the rows the Forwarder has passed, from a
// periodic job. docs/outbox.md has the guarantees, the costs and the
// retention of outbox rows.
//
// # Use
//
//	outbox, err := sqloutbox.NewPostgres(pool, store, sqloutbox.Options{})
//	...
//	charge := router.AddConsumerHandler("charge", "orders", sub, outbox.Handler(
//		func(tx *sqloutbox.PgxTx, msg *message.Message) error {
//			if _, err := tx.Exec(msg.Context(), `INSERT INTO charges ...`, ...); err != nil {
//				return err
//			}
//			return tx.Publish("receipts", message.NewMessage(receiptID, payload))
//		}))
//	charge.AddMiddleware(idem.Middleware)
//	fwd, err := outbox.NewForwarder(brokerPublisher, logger, forwarder.Config{}) // its own router
//	go fwd.Run(ctx)
//
// On MySQL or MariaDB, mysqloutbox.New does the same with database/sql
// and a *sql.Tx.
//
// # Outside a Watermill handler
//
// [Postgres.WithTx] is the same transaction for any work that runs under
// a lease: a function given to the middleware package's Do, an HTTP
// handler behind its Idempotency-Key door. It takes the lease from the
// context, runs the function, completes the key in the transaction with
// the output that door records for duplicates (middleware's
// CompletionOutput), and commits; the door sees the key completed by its
// own lease and does not complete it again. Handler is WithTx with the
// message's context.
//
//	_, err := idempotency.Do(ctx, idem, orderID, func(ctx context.Context) (struct{}, error) {
//		return struct{}{}, outbox.WithTx(ctx, func(tx *sqloutbox.PgxTx) error { // Do's ctx: it holds the lease
//			if _, err := tx.Exec(ctx, `INSERT INTO refunds ...`, ...); err != nil {
//				return err
//			}
//			return tx.Publish("refunds", message.NewMessage("refund-"+orderID, payload))
//		})
//	})
//
// Without a lease in the context, WithTx returns [ErrNoLease] and runs
// nothing.
package sqloutbox
