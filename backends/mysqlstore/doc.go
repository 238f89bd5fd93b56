// Package mysqlstore is a [backends.Store] on MySQL or MariaDB (InnoDB),
// on database/sql with go-sql-driver/mysql. It is its own Go module. Like
// pgstore it completes a key in the handler's own transaction
// ([Store.CompleteTx]), for exactly-once effects; outside a Watermill
// handler, [Store.CompleteTxOutput] does the same with the output the
// middleware package's CompletionOutput returns.
//
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
//	store, err := mysqlstore.New(db, mysqlstore.Options{})
//	err = store.Migrate(ctx)
//
// # Protocol
//
// Acquire is an INSERT ... ON DUPLICATE KEY UPDATE that decides, on the
// locked row and with the server's clock, whether the caller takes the
// lease. On MariaDB 10.5 and later a RETURNING clause answers in the same
// statement, and an insert whose update changes nothing goes first: it
// answers a new key, a completed one and another owner's live lease alone,
// and the upsert runs only for a record it would change (a released or
// expired lease, one past its retention, the owner's own, a fingerprint
// to adopt). Calls that arrive while Options.InFlight such inserts are
// out queue, and go as one statement, one row of values each, when one
// comes back: MariaDB's cost is mostly per statement, not per row;
// completions share statements the same way. On
// MySQL (no RETURNING) a plain insert goes first, which
// answers a new key alone; for a key with a record the upsert and a read
// of the row run in one transaction. Renew, Complete and Release are
// UPDATEs that match only the lease's owner, fencing token and live
// record. The store's own
// statements that deadlock (1213) or time out waiting for a lock (1205)
// are run again, a few times. Inside the caller's transaction
// ([Store.CompleteTx]) they are not: a deadlock rolled back the whole
// transaction, while a lock wait timeout (with InnoDB's default
// innodb_rollback_on_timeout=OFF) rolled back only the completion and
// left the transaction open with the handler's writes. Either way the
// caller rolls the transaction back and returns the error, and the
// message is redelivered.
//
// # Time
//
// Times are Unix microseconds from UTC_TIMESTAMP(6), fixed for a statement
// and independent of the session's time zone; the driver's loc and
// parseTime settings do not matter.
//
// # Keys
//
// Keys and owners are VARBINARY: compared byte for byte, so no collation
// makes 'order-A' and 'ORDER-a' (or 'order-a ') the same key.
//
// # Record lifetime
//
// A record counts as absent one retention after its lease ends, it is
// released or it is completed; [Store.Cleanup] and [Store.RunCleaner]
// delete such records in bounded batches, but correctness never depends on
// them. A completion within its lease leaves the cleanup index alone, so
// the row of a record so completed is deleted once its lease's end plus
// the retention has passed too. docs/mysql.md has the schema, the dialects
// and tuning.
package mysqlstore
