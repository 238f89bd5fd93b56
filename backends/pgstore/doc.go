// Package pgstore is a [backends.Store] on Postgres (pgx v5), for services
// whose idempotency records should live, and commit, with their own data.
//
//	store, err := pgstore.New(pool, pgstore.Options{}) // a *pgxpool.Pool
//	if err != nil {
//		return err
//	}
//	if err := store.Migrate(ctx); err != nil { // idempotent; safe from many instances at once
//		return err
//	}
//	defer store.Close() // ends the listener that wakes waiting duplicates
//
// # Statements
//
// Each store call is one SQL statement on the database's clock (now()),
// with the key, owner and every value as bind parameters. Acquire calls a
// function that Migrate creates: a fresh key is one INSERT ... ON
// CONFLICT DO NOTHING; a record it cannot change (completed, or another
// owner's live lease) is read and nothing is written; anything else runs
// an INSERT ... ON CONFLICT DO UPDATE that locks the key's row and
// returns it, so concurrent acquirers are serialised on the row and each
// sees it as the one before left it. Renew, Complete and Release are
// UPDATEs that match only the lease's own owner and fencing token. Keys are
// stored as bytea, so any bytes, NUL included, are a key.
//
// Each statement that finds a record by its key calls a function that
// Migrate creates, declared expensive, on the row it finds, so that its
// plan stays a lookup of the primary key whatever the table's statistics
// say (a table analyzed while empty would otherwise get sequential scans).
//
// # Calls sent together
//
// Acquire, Complete and Release calls that arrive while as many batches
// as [Options.InFlight] says (by default a quarter of the pool's
// connections, at most GOMAXPROCS) are in flight queue, and are sent
// together when one comes back: one round trip and one transaction for
// all of them, their rows locked in key order. A call that does not have to queue is sent at
// once, alone. If Postgres refuses a statement of a batch, each of its
// calls is sent again alone.
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
// Outside a Watermill handler (a function run by the middleware package's
// Do, an HTTP handler), [Store.CompleteTxOutput] does the same with the
// output the middleware package's CompletionOutput returns.
//
// # Waking waiting duplicates
//
// The store is a [backends.Watcher]: a duplicate that
// waits for a key another owner holds is woken through LISTEN/NOTIFY when
// the key is completed, released or deleted, instead of polling. Watch
// marks the row of the key's lease in progress (the waited column); the
// next Complete, Release, CompleteTx or Delete of a marked row calls
// pg_notify in its own statement, delivered when its transaction
// commits, and clears the mark. A key nobody watches never sends a
// notification, so the common path takes none of the commit-time lock
// that NOTIFY takes. The channel is "idempotency_" and 16 hex digits of
// a hash of the table's name, the payload the hex MD5 of the key. A store listens on
// one connection of its own, taken out of its pool on the first Watch;
// call [Store.Close] when done with the store. A store with [WakePoll]
// (needed behind a pooler in transaction mode) does not watch, and the
// middleware polls.
//
// # Retention and cleanup
//
// A record past its retention counts as absent at once: correctness never
// depends on a cleanup having run. [Store.Cleanup] deletes such records in
// bounded batches; [Store.RunCleaner] runs it periodically until its
// context is cancelled. A completion within its lease changes no indexed
// column, so Postgres makes it a HOT update; the row of a record so
// completed is deleted once its lease's end plus the retention has passed
// too.
package pgstore
