// Package pgstore is a [backends.Store] on Postgres (pgx v5), for services
// whose idempotency records should live, and commit, with their own data.
//
//	store, err := pgstore.New(pool, pgstore.Options{}) // a *pgxpool.Pool, *pgx.Conn or pgx.Tx
//	if err != nil {
//		return err
//	}
//	if err := store.Migrate(ctx); err != nil { // idempotent; safe from many instances at once
//		return err
//	}
//
// # Statements
//
// Each store call is one SQL statement on the database's clock (now()),
// with the key, owner and every value as bind parameters. Acquire is a
// single INSERT ... ON CONFLICT DO UPDATE that locks the key's row and
// returns it, so concurrent acquirers are serialised on the row and each
// sees it as the one before left it. Renew, Complete and Release are
// UPDATEs that match only the lease's own owner and fencing token. Keys are
// stored as bytea, so any bytes, NUL included, are a key.
//
// # Exactly-once effects
//
// A lease alone gives at most one holder at a time, not exactly-once
// effects across crashes: the handler's writes can commit and the process
// die before the completion is recorded. With [Store.CompleteTx] the
// handler completes the key in the transaction that holds its own writes.
// If it commits, every redelivery is dropped, even when the process dies
// before the ack; if it rolls back, the key is retried. The middleware sees
// that the handler completed the key and does not complete it again.
//
// # Retention and cleanup
//
// A record past its retention counts as absent at once: correctness never
// depends on a cleanup having run. [Store.Cleanup] deletes such records in
// bounded batches; [Store.RunCleaner] runs it periodically until its
// context is cancelled.
package pgstore
