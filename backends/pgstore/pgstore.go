package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

var (
	_ backends.Store     = (*Store)(nil)
	_ backends.PoolSizer = (*Store)(nil)
	_ backends.Lister    = (*Store)(nil)
)

// execer runs a statement: the store's pool, or the caller's transaction
// in CompleteTx.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// The table's forget_at index and its acquire function are named after
// the table, with these suffixes.
const (
	indexSuffix   = "_fa"
	acquireSuffix = "_acquire"
)

// addedColumns are the columns schema.sql adds to a table of an earlier
// release: Migrate has nothing to do only if each exists.
var addedColumns = []string{"waited", "origin", "acquired_at"}

// Defaults for [Options].
const (
	DefaultSchema = "public"
	DefaultTable  = "idempotency_keys"
)

// Options configures a [Store]. The zero value is ready to use.
type Options struct {
	// Schema holds the table; Migrate creates it if needed.
	// Defaults to DefaultSchema.
	Schema string
	// Table is the records' table. Defaults to DefaultTable.
	Table string
	// Unlogged makes Migrate create the table UNLOGGED: writes skip the
	// write-ahead log (about twice the throughput, see docs/benchmarks.md),
	// but a crash of the server empties the table and it is not replicated.
	// Only for records you can afford to lose, as with Redis without
	// persistence; never with CompleteTx for exactly-once effects.
	// It has no effect on a table that already exists. Defaults to false.
	Unlogged bool
	// Wake says how duplicates waiting for a key learn that it changed.
	// Defaults to WakeNotify.
	Wake Wake
	// InFlight is how many of the store's Acquire, Complete and Release
	// round trips may be in flight at once, each a call sent alone or a
	// batch: the calls that arrive while that many are out queue, and go
	// as one batch, one transaction, when one comes back. 0, the default,
	// is a quarter of the pool's MaxConns, at most GOMAXPROCS, at least 1;
	// it stays 0 in [Store.Options], which then fit a store on another
	// pool or in another process. Fewer in flight means bigger batches,
	// which cost Postgres and the process less per call but run one after
	// the other on a connection: on a server whose CPUs the store keeps
	// busy, about as many as it has CPUs cost it least (docs/postgres.md,
	// "Calls sent together").
	InFlight int
}

// Wake says how the duplicates that wait for a key another owner holds
// learn that it was completed, released or deleted.
type Wake int

const (
	// WakeNotify wakes them through LISTEN/NOTIFY ([Store.Watch]), the
	// middleware polling slowly as a safety net. The default.
	WakeNotify Wake = iota
	// WakePoll makes Watch report not ok, so that waiting duplicates poll
	// the store. Set it when the pool reaches Postgres through a pooler
	// in transaction mode (pgbouncer's pool_mode = transaction), where
	// LISTEN does not work.
	WakePoll
)

// Store is a [backends.Store] on Postgres. Create it with [New] and call
// [Store.Migrate] once before use. It is also a [backends.Watcher]; call
// [Store.Close] when done with a store that watched.
type Store struct {
	pool     *pgxpool.Pool
	opts     Options
	sql      statements
	poolSize int
	channel  string
	listener *listener // nil if the store cannot watch
	batcher  *batcher
}

// liveFunc is the function, in the store's schema, that tells whether a
// record still counts (schema.sql); the statements that find a record by
// its key call it on the row they find, which keeps their plans on the
// primary key.
const liveFunc = "idempotency_live"

// New returns a store on pool, which it shares with the application: it
// takes a connection for each call, and one for good for its listener
// (see [Store.Watch]). It does not contact the server. It returns an
// error wrapping [backends.ErrNilClient] for a nil pool, and one wrapping
// [backends.ErrInvalidOptions] for a schema or table name too long for
// Postgres (63 bytes; 55 for the table, whose acquire function is named
// after it with 8 more), an unknown Wake or a negative InFlight.
func New(pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("pgstore: %w", backends.ErrNilClient)
	}
	if opts.Schema == "" {
		opts.Schema = DefaultSchema
	}
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if opts.Wake != WakeNotify && opts.Wake != WakePoll {
		return nil, fmt.Errorf("pgstore: %w: unknown Wake %d", backends.ErrInvalidOptions, int(opts.Wake))
	}
	if opts.InFlight < 0 {
		return nil, fmt.Errorf("pgstore: %w: negative InFlight %d", backends.ErrInvalidOptions, opts.InFlight)
	}
	if len(opts.Schema) > 63 || len(opts.Table) > 63-len(acquireSuffix) {
		return nil, fmt.Errorf("pgstore: %w: schema or table name too long for Postgres (63 bytes; the table's acquire function adds %d to the table's)", backends.ErrInvalidOptions, len(acquireSuffix))
	}
	data := newSQLData(opts)
	sql, err := render(data)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	s := &Store{pool: pool, opts: opts, sql: sql, poolSize: int(pool.Config().MaxConns), channel: data.Channel}
	if opts.Wake == WakeNotify {
		s.listener = newListener(pool, data.Channel, sql.listen, sql.ping)
	}
	inFlight := opts.InFlight
	if inFlight == 0 {
		inFlight = defaultInFlight(s.poolSize, runtime.GOMAXPROCS(0))
	}
	s.batcher = newBatcher(pool, inFlight)
	return s, nil
}

// defaultInFlight is Options.InFlight's default for a pool of poolSize
// connections in a process of procs Ps: a quarter of the pool, at most
// procs, at least 1. Each round trip in flight costs the process its
// own sends, reads and wakeups, and Postgres a transaction: past as many
// as the process has CPUs, more of them only make the batches smaller,
// and each call dearer for both.
func defaultInFlight(poolSize, procs int) int { return max(1, min(poolSize/4, procs)) }

// PoolSize implements [backends.PoolSizer]: the pool's MaxConns. The
// middleware lets new acquisitions take at most half of it by default.
func (s *Store) PoolSize() int { return s.poolSize }

// MigrationSQL returns the SQL that Migrate runs: the schema, the table
// and its index, each created if it does not exist, the columns added
// since to a table of an earlier release, and the functions the store's
// statements call, created or replaced. Give it to an external migration
// tool instead of calling Migrate, and run it again after an upgrade of
// this package: a release may add to it (docs/upgrading.md).
func (s *Store) MigrationSQL() string { return s.sql.schema + "\n\n" + s.sql.functions }

// Schema returns the same SQL as [Store.MigrationSQL]. It is named like
// [Options.Schema], which is a schema's name, not SQL.
//
// Deprecated: use MigrationSQL.
func (s *Store) Schema() string { return s.MigrationSQL() }

// Options returns the store's options with defaults applied, but for an
// InFlight of 0, which stays 0: its default depends on the pool.
func (s *Store) Options() Options { return s.opts }

// migrationLockID is the advisory lock Migrate holds while it runs, so that
// instances starting at once do not race on CREATE ... IF NOT EXISTS.
const migrationLockID = 0x1de_0_7e47

// Migrate creates the schema, the table and its index if they do not
// exist, adds the columns added since to a table of an earlier release
// (waited, origin, acquired_at), and creates the table's acquire
// function, or replaces it if its body is not this version's. It is
// idempotent and safe to call from several instances at once. On a
// current schema it only reads the catalog, and takes no lock that would
// wait for, or hold up, the calls of running instances; on a current
// table whose acquire function is missing or another version's (as when
// a release adds or changes it) it only creates or replaces the
// function, which locks no table.
//
// Adding columns rewrites no row, but takes the table's ACCESS EXCLUSIVE
// lock for a moment, and while ALTER TABLE waits for that lock (behind a
// transaction that holds the table, such as a handler's, open around
// CompleteTx) every call on the table queues behind it. So Migrate waits
// for a table's lock at most [MigrateLockTimeout] at a time, and tries
// again after a pause, for up to a minute (or until ctx is done), before
// it returns the lock timeout as its error.
func (s *Store) Migrate(ctx context.Context) error {
	// A current table is left alone: ALTER TABLE and CREATE INDEX lock
	// the table even when IF NOT EXISTS makes them do nothing, and a
	// deploy that migrates at start-up must not queue behind, and block,
	// the traffic of the instances already running.
	var table, functions bool
	if err := s.pool.QueryRow(ctx, s.sql.current, functionBody(s.sql.functions)).Scan(&table, &functions); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	if table && functions {
		return nil
	}
	giveUp := time.Now().Add(migrateWait)
	for try := 0; ; try++ {
		err := s.migrate(ctx, !table)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != lockNotAvailable {
			return err
		}
		pause := rand.N(min(10*time.Millisecond<<try, time.Second)) + time.Millisecond
		if time.Now().Add(pause).After(giveUp) {
			return fmt.Errorf("%w (the table stayed locked for %v: a transaction holds it)", err, migrateWait)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
}

// MigrateLockTimeout is the longest Migrate waits for a table's lock at
// a time, and so the longest it holds up the calls that queue behind it.
const MigrateLockTimeout = 100 * time.Millisecond

// migrateWait bounds how long Migrate tries to take a table's lock.
const migrateWait = time.Minute

// lockNotAvailable is the SQLSTATE of a lock_timeout.
const lockNotAvailable = "55P03"

// migrate runs one attempt of Migrate, in one transaction: the schema if
// the table is not current, and the functions.
func (s *Store) migrate(ctx context.Context, schema bool) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.Exec(ctx, s.sql.lock, int64(migrationLockID)); err != nil {
		return fmt.Errorf("pgstore: migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, s.sql.lockTimeout); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	if schema {
		if _, err := tx.Exec(ctx, s.sql.schema); err != nil {
			return fmt.Errorf("pgstore: migrate: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, s.sql.functions); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgstore: migrate: commit: %w", err)
	}
	return nil
}

// functionBody returns the body of the acquire function that functions
// (acquire.sql, rendered) creates: what Postgres keeps as its source.
func functionBody(functions string) string {
	_, body, _ := strings.Cut(functions, bodyQuote)
	body, _, _ = strings.Cut(body, bodyQuote)
	return body
}

// bodyQuote is the dollar quote around the acquire function's body.
const bodyQuote = "$acquire$"

// opError wraps a failed call's error, marking with [backends.ErrRejected]
// the server errors that retrying the call cannot fix.
func opError(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && rejectedClass(pgErr.Code) {
		return fmt.Errorf("pgstore: %s: %w: %w", op, backends.ErrRejected, err)
	}
	return fmt.Errorf("pgstore: %s: %w", op, err)
}

// rejectedClass reports whether a SQLSTATE is in a class of errors that
// retrying cannot fix: data exceptions (22), invalid authorization (28),
// syntax errors and access rule violations such as a missing table or
// privilege (42), program limits such as an oversize index row (54),
// unsupported features (0A), invalid catalog or schema names (3D, 3F).
// Connection loss (08), resource shortage (53), operator intervention (57),
// serialization failures and deadlocks (40) are transient.
func rejectedClass(code string) bool {
	if len(code) != 5 {
		return false
	}
	switch code[:2] {
	case "22", "28", "42", "54", "0A", "3D", "3F":
		return true
	}
	return false
}

// us converts d to whole microseconds, rounding up, so a lease is never
// shorter than asked for.
func us(d time.Duration) int64 { return int64((d + time.Microsecond - 1) / time.Microsecond) }

// Acquire implements [backends.Store].
func (s *Store) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	if err := storekit.ValidateAcquire(req); err != nil {
		return backends.AcquireResult{}, err
	}
	var (
		state, how      int16
		owner           string
		token           int64
		attempt         int32
		leaseExp, now   time.Time
		completedAt     *time.Time
		fp, output      []byte
		fingerprintArgs any
	)
	if req.Fingerprint != nil {
		fingerprintArgs = req.Fingerprint
	}
	key := []byte(req.Key)
	err := s.batcher.do(&call{ctx: ctx, key: key, sql: s.sql.acquire,
		args: []any{key, req.Owner, us(req.LeaseTTL), us(req.Retention), fingerprintArgs, req.Origin},
		dest: []any{&state, &owner, &token, &attempt, &how, &leaseExp, &completedAt, &fp, &output, &now}})
	if err != nil {
		return backends.AcquireResult{}, opError("acquire", err)
	}
	res := backends.AcquireResult{Fingerprint: nilIfEmpty(fp)}
	switch {
	case state == stateCompleted:
		res.Status = backends.StatusCompleted
		if completedAt != nil {
			res.CompletedAt = *completedAt
		}
		res.Output = nilIfEmpty(output)
	case state == stateInProgress && owner == req.Owner:
		res.Status = backends.StatusAcquired
		res.Lease = backends.Lease{Key: req.Key, Owner: owner, Token: token, Attempt: int(attempt), Takeover: how == howTakeover}
		res.Reentrant = how == howReentrant
	case state == stateInProgress:
		res.Status = backends.StatusInProgress
		res.Remaining = leaseExp.Sub(now)
	default:
		return backends.AcquireResult{}, fmt.Errorf("pgstore: acquire: record of %q in unexpected state %d", req.Key, state)
	}
	return res, nil
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// held runs an UPDATE that matches only the lease's own live record: on
// db (the store's pool, or the caller's transaction), or through the
// store's batcher if db is nil.
func (s *Store) held(ctx context.Context, db execer, op, sql string, lease backends.Lease, args ...any) error {
	if err := storekit.ValidateLease(lease); err != nil {
		return err
	}
	key := []byte(lease.Key)
	args = append([]any{key, lease.Owner, lease.Token}, args...)
	var tag pgconn.CommandTag
	var err error
	if db == nil {
		c := &call{ctx: ctx, key: key, sql: sql, args: args}
		err = s.batcher.do(c)
		tag = c.tag
	} else {
		tag, err = db.Exec(ctx, sql, args...)
	}
	if err != nil {
		return opError(op, err)
	}
	if tag.RowsAffected() != 1 {
		return backends.ErrLeaseLost
	}
	return nil
}

// Renew implements [backends.Store].
func (s *Store) Renew(ctx context.Context, lease backends.Lease, ttl time.Duration) error {
	if err := storekit.ValidateLeaseTTL(ttl); err != nil {
		return err
	}
	// Alone, never batched: a renewal waits for its row's lock while the
	// handler's CompleteTx holds it, and must not hold up other calls.
	return s.held(ctx, s.pool, "renew", s.sql.renew, lease, us(ttl))
}

// Complete implements [backends.Store].
func (s *Store) Complete(ctx context.Context, lease backends.Lease, output []byte) error {
	return s.complete(ctx, nil, lease, output)
}

// CompleteTx completes the lease inside tx, the transaction in which the
// handler wrote its own rows, with the messages the handler will return:
// if tx commits, the work, its completion and its output are recorded
// together; if it rolls back, none is, and the key is retried. tx is the
// application's own transaction, begun on any pool or connection to the
// store's database. Take the lease from the handler's context
// (LeaseFromContext in the middleware package). The middleware notices
// that the handler completed the key and does not complete it again; a
// duplicate
// gets output replayed, so pass exactly what the handler returns. The
// notification to the key's watchers, if any (see [Store.Watch]), is
// delivered when tx commits, and never if it rolls back.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, lease backends.Lease, output []*message.Message) error {
	return s.CompleteTxOutput(ctx, tx, lease, backends.EncodeOutput(output))
}

// CompleteTxOutput is [Store.CompleteTx] with the output already encoded,
// as [Store.Complete] takes it: the bytes are stored as they are and
// handed to the key's duplicates. It is for work that completes its own
// key in its own transaction outside a Watermill handler (a function run
// by the middleware package's Do, an HTTP handler behind its
// Idempotency-Key door): pass what the middleware package's
// CompletionOutput returns for the work's context, which is what that
// door replays. It returns an error wrapping [backends.ErrInvalidRequest]
// for a nil tx, and [backends.ErrLeaseLost] if the lease no longer holds
// the key; on any error, roll tx back.
func (s *Store) CompleteTxOutput(ctx context.Context, tx pgx.Tx, lease backends.Lease, output []byte) error {
	if tx == nil {
		// A nil execer would complete through the store's own pool,
		// outside the caller's transaction.
		return fmt.Errorf("pgstore: complete: %w: nil transaction", backends.ErrInvalidRequest)
	}
	return s.complete(ctx, tx, lease, output)
}

func (s *Store) complete(ctx context.Context, db execer, lease backends.Lease, output []byte) error {
	return s.held(ctx, db, "complete", s.sql.complete, lease, output)
}

// Release implements [backends.Store].
func (s *Store) Release(ctx context.Context, lease backends.Lease) error {
	return s.held(ctx, nil, "release", s.sql.release, lease)
}

// Inspect implements [backends.Store].
func (s *Store) Inspect(ctx context.Context, key string) (backends.Record, error) {
	if err := storekit.ValidateKey(key); err != nil {
		return backends.Record{}, err
	}
	rec, err := scanRecord(s.pool.QueryRow(ctx, s.sql.inspect, []byte(key)))
	if errors.Is(err, pgx.ErrNoRows) {
		return backends.Record{}, backends.ErrNotFound
	}
	if err != nil {
		return backends.Record{}, opError("inspect", err)
	}
	return rec, nil
}

// scanRecord reads a row of the "record columns" (statements.sql).
func scanRecord(row pgx.Row) (backends.Record, error) {
	var (
		key                     []byte
		state                   int16
		attempt                 int32
		rec                     backends.Record
		completedAt, acquiredAt *time.Time
		origin                  *string
		now                     time.Time
		fingerprint, output     []byte
	)
	if err := row.Scan(&key, &state, &rec.Owner, &rec.Token, &attempt,
		&rec.LeaseExpiresAt, &completedAt, &rec.ExpiresAt, &fingerprint, &output, &now, &acquiredAt, &origin); err != nil {
		return backends.Record{}, err
	}
	rec.Key = string(key)
	rec.Attempt = int(attempt)
	rec.Fingerprint, rec.Output = nilIfEmpty(fingerprint), nilIfEmpty(output)
	if acquiredAt != nil { // NULL in a row an earlier release wrote
		rec.AcquiredAt = *acquiredAt
	}
	if origin != nil {
		rec.Origin = *origin
	}
	switch {
	case state == stateCompleted:
		rec.State = backends.StateCompleted
		if completedAt != nil {
			rec.CompletedAt = *completedAt
		}
	case state == stateReleased:
		rec.State = backends.StateReleased
	case rec.LeaseExpiresAt.After(now):
		rec.State = backends.StateInProgress
	default:
		rec.State = backends.StateExpired
	}
	return rec, nil
}

// Delete implements [backends.Store].
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := storekit.ValidateKey(key); err != nil {
		return err
	}
	var n int64
	if err := s.pool.QueryRow(ctx, s.sql.delete, []byte(key)).Scan(&n, nil); err != nil {
		return opError("delete", err)
	}
	if n == 0 {
		return backends.ErrNotFound
	}
	return nil
}

// Cleanup deletes up to batch records past their retention, oldest first,
// and returns how many it deleted; a record completed within its lease
// once its lease's end plus the retention has passed too. Records past
// their retention already count as absent, so cleanup only reclaims
// space; it never changes what the store answers. It notifies the watchers of a record it deletes, if
// a watch marked it (see [Store.Watch]). Concurrent cleanups skip each
// other's rows.
func (s *Store) Cleanup(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		return 0, fmt.Errorf("%w: batch must be positive, got %d", backends.ErrInvalidRequest, batch)
	}
	var n int64
	if err := s.pool.QueryRow(ctx, s.sql.cleanup, batch).Scan(&n, nil); err != nil {
		return 0, opError("cleanup", err)
	}
	return n, nil
}

// RunCleaner calls Cleanup every interval, in batches of batch records,
// until ctx is done; a full batch is followed at once by another. It
// returns ctx's error. Run it in a goroutine of your own and cancel ctx to
// stop it. Errors from Cleanup are passed to onError (which may be nil)
// and do not stop the cleaner.
func (s *Store) RunCleaner(ctx context.Context, interval time.Duration, batch int, onError func(error)) error {
	return storekit.RunCleaner(ctx, interval, batch, onError, s.Cleanup)
}
