package mysqlstore

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

var (
	_ backends.Store     = (*Store)(nil)
	_ backends.PoolSizer = (*Store)(nil)
	_ backends.Lister    = (*Store)(nil)
)

// Execer is what CompleteTx needs from the caller's transaction: a
// *sql.Tx, a *sql.Conn and a *sql.DB all satisfy it.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// DefaultTable is the table [Options.Table] defaults to.
const DefaultTable = "idempotency_keys"

// Flavor is the server's SQL dialect, as far as the store cares.
type Flavor int

const (
	// FlavorDetect asks the server (SELECT VERSION()) on first use.
	FlavorDetect Flavor = iota
	// FlavorMariaDB: MariaDB 10.5 or later, whose INSERT ... RETURNING
	// makes Acquire one statement.
	FlavorMariaDB
	// FlavorMySQL: MySQL 8, or an older MariaDB. Acquire runs its upsert
	// and a read of the row in one transaction.
	FlavorMySQL
)

// String returns the flavor's name.
func (f Flavor) String() string {
	switch f {
	case FlavorDetect:
		return "detect"
	case FlavorMariaDB:
		return "mariadb"
	case FlavorMySQL:
		return "mysql"
	}
	return fmt.Sprintf("Flavor(%d)", int(f))
}

// Options configures a [Store]. The zero value is ready to use.
type Options struct {
	// Table is the records' table, optionally qualified by its database
	// ("db.table"); Migrate creates it. Defaults to DefaultTable.
	Table string
	// Flavor is the server's dialect. Defaults to FlavorDetect.
	Flavor Flavor
	// InFlight is, on MariaDB, how many of the store's Acquire statements,
	// and how many of its Complete statements, may be in flight at once,
	// each for a call alone or for a batch: the calls that arrive while
	// that many are out queue, and go as one statement when one comes
	// back. 0, the default, is a quarter of the db's open-connection limit
	// when New is called (sql.DB.SetMaxOpenConns), at most GOMAXPROCS, at
	// least 1; or GOMAXPROCS if the db sets no limit. It stays 0 in
	// [Store.Options].
	// MariaDB spends most of a statement's cost on the statement itself,
	// not its rows, so a batch costs it a fraction per call (docs/mysql.md,
	// "Calls sent together"). MySQL, without RETURNING, runs each call
	// alone.
	InFlight int
}

// Store is a [backends.Store] on MySQL or MariaDB (InnoDB). Create it
// with [New] and call [Store.Migrate] once before use.
type Store struct {
	db   *sql.DB
	opts Options
	data sqlData // what the statements were rendered with, for "add columns"; Now and Until unset
	sql  statements

	mu     sync.Mutex
	flavor Flavor // detected, or opts.Flavor

	prepared sync.Map // SQL → *sql.Stmt: the calls' statements, prepared once

	acquires  *storekit.Batcher[*acquireCall]  // Acquire's first statement, on MariaDB
	completes *storekit.Batcher[*completeCall] // Complete, on MariaDB
}

// The state column's codes. They are stored in the table, and rows that
// every release since the first wrote hold them: they must never change.
const (
	// stateInProgress is a lease: live until lease_expires_us, expired
	// from then on.
	stateInProgress = 1
	// stateReleased is a lease its owner released.
	stateReleased = 2
	// stateCompleted is a completed key; completed_us says when.
	stateCompleted = 3
)

// How an Acquire decided, in the how column (acquire.sql). They are
// stored in the table: they must never change. An Acquire that changes
// nothing leaves the column as it was; versions before this one wrote
// howRefused there.
const (
	howFresh        = 0 // a new record, or one past its retention
	howTakeover     = 1 // a takeover of an expired lease
	howReentrant    = 2 // the owner's own lease again
	howAfterRelease = 3 // a new lease after a release
	howRefused      = 4 // nothing changed, as versions before this one wrote it
	// howUnchanged is added to the old code while an upsert that changes
	// nothing runs, and taken off again by its last assignment. It is
	// larger than every code, so that how >= howUnchanged tells it apart.
	howUnchanged = 8
)

// sqlData is what the SQL templates (schema.sql, acquire.sql,
// statements.sql) are rendered with.
type sqlData struct {
	Table, Index string // quoted
	// Now and Until are statements.sql's "now" and "until", rendered
	// first: expressions that many statements share.
	Now, Until string
	State      struct{ InProgress, Released, Completed int }
	How        struct{ Fresh, Takeover, Reentrant, AfterRelease, Unchanged int }
	// Add is, for "add columns" only, the columns to add: each a name and
	// its definition.
	Add [][2]string
	// Calls are the indexes of a statement's calls: {{argAt "name" $i}}
	// binds call $i's value of name. A statement of one call has {0};
	// "acquire first" and "complete together" are rendered for each
	// number of calls in a batch.
	Calls []int
}

// statement is SQL with ? placeholders and the names of its parameters,
// in order; for a statement of several calls, the call of each too.
type statement struct {
	sql   string
	names []string
	calls []int
}

// argsOf returns the values of st's parameters, each from its call's
// params in ps.
func (st statement) argsOf(ps []*params) []any {
	out := make([]any, len(st.names))
	for i, n := range st.names {
		out[i], _ = ps[st.calls[i]].value(n)
	}
	return out
}

// args returns the values of st's parameters in p, in order.
func (st statement) args(p *params) []any {
	out := make([]any, len(st.names))
	for i, n := range st.names {
		out[i], _ = p.value(n)
	}
	return out
}

// params are the values a call binds, by the names its statement's
// {{arg "name"}} parameters have.
type params struct {
	key, owner, after, lower  []byte
	token, ttl, ret, seconds  int64
	limit, batch              int
	origin, fp, output, upper any // nil for SQL NULL
	state, live               any // List's filter: nil for any
	lock, table               string
	database                  sql.NullString
}

// value returns the parameter name's value, and whether there is such a
// parameter.
func (p *params) value(name string) (any, bool) {
	switch name {
	case "key":
		return p.key, true
	case "owner":
		return p.owner, true
	case "after":
		return p.after, true
	case "lower":
		return p.lower, true
	case "token":
		return p.token, true
	case "ttl":
		return p.ttl, true
	case "ret":
		return p.ret, true
	case "seconds":
		return p.seconds, true
	case "limit":
		return p.limit, true
	case "batch":
		return p.batch, true
	case "origin":
		return p.origin, true
	case "fp":
		return p.fp, true
	case "output":
		return p.output, true
	case "upper":
		return p.upper, true
	case "state":
		return p.state, true
	case "live":
		return p.live, true
	case "lock":
		return p.lock, true
	case "table":
		return p.table, true
	case "database":
		return p.database, true
	}
	return nil, false
}

type statements struct {
	schema                              statement
	acquire, acquireReturning           statement
	acquireInsert                       statement
	acquireFirst                        [maxBatch + 1]statement // by the number of calls, from 1
	completeTogether                    [maxBatch + 1]statement // by the number of calls, from 2
	completedBy                         statement
	acquireRead                         statement
	renew, complete, release, stillHeld statement
	inspect, list, count                statement
	deleteLive, deleteAny, cleanup      statement
	database, getLock, releaseLock      statement
	columns, shortLockWait              statement
	defaultLockWait, version            statement
}

//go:embed schema.sql acquire.sql statements.sql
var sqlFiles embed.FS

// sqlTemplates are the SQL files, parsed. Their "arg" is bound in each
// renderer, which records the parameters' names; this one fails, so that
// a render outside a renderer cannot go unnoticed.
var sqlTemplates = template.Must(template.New("").Funcs(template.FuncMap{
	"arg":   func(string) (string, error) { return "", errors.New("arg outside a renderer") },
	"argAt": func(string, int) (string, error) { return "", errors.New("argAt outside a renderer") },
}).ParseFS(sqlFiles, "*.sql"))

// renderer renders the SQL templates with one sqlData. It is not safe for
// concurrent use.
type renderer struct {
	t     *template.Template
	data  sqlData
	names []string // of the parameters rendered so far
	calls []int    // and their calls', for argAt
}

func newRenderer(data sqlData) (*renderer, error) {
	r := &renderer{data: data}
	t, err := sqlTemplates.Clone()
	if err != nil {
		return nil, err
	}
	argAt := func(name string, call int) (string, error) {
		if _, ok := (&params{}).value(name); !ok {
			return "", fmt.Errorf("unknown parameter %q", name)
		}
		r.names = append(r.names, name)
		r.calls = append(r.calls, call)
		return "?", nil
	}
	r.t = t.Funcs(template.FuncMap{
		"arg":   func(name string) (string, error) { return argAt(name, 0) },
		"argAt": argAt,
	})
	return r, nil
}

// render renders the template name.
func (r *renderer) render(name string) (statement, error) {
	r.names, r.calls = nil, nil
	var b strings.Builder
	if err := r.t.ExecuteTemplate(&b, name, r.data); err != nil {
		return statement{}, err
	}
	return statement{sql: b.String(), names: r.names, calls: r.calls}, nil
}

// renderStatements renders every statement a store with data runs but
// Migrate's "add columns", which depends on the table.
func renderStatements(data sqlData) (statements, error) {
	r, err := newRenderer(data)
	if err != nil {
		return statements{}, err
	}
	var first error
	get := func(name string) statement {
		st, err := r.render(name)
		if err != nil && first == nil {
			first = err
		}
		return st
	}
	r.data.Now = get("now").sql
	r.data.Calls = []int{0}
	r.data.Until = get("until").sql
	st := statements{
		schema:           get("schema.sql"),
		acquire:          get("acquire"),
		acquireReturning: get("acquire returning"),
		acquireInsert:    get("acquire insert"),
		acquireRead:      get("acquire read"),
		renew:            get("renew"),
		complete:         get("complete"),
		release:          get("release"),
		completedBy:      get("completed by"),
		stillHeld:        get("still held"),
		inspect:          get("inspect"),
		list:             get("list"),
		count:            get("count"),
		deleteLive:       get("delete live"),
		deleteAny:        get("delete any"),
		cleanup:          get("cleanup"),
		database:         get("database"),
		getLock:          get("get lock"),
		releaseLock:      get("release lock"),
		columns:          get("columns"),
		shortLockWait:    get("short lock wait"),
		defaultLockWait:  get("default lock wait"),
		version:          get("version"),
	}
	for n := 1; n <= maxBatch && first == nil; n++ {
		r.data.Calls = make([]int, n)
		for i := range r.data.Calls {
			r.data.Calls[i] = i
		}
		st.acquireFirst[n], first = r.render("acquire first")
		if n > 1 && first == nil {
			st.completeTogether[n], first = r.render("complete together")
		}
	}
	return st, first
}

var tableRE = regexp.MustCompile(`^[A-Za-z0-9_$]{1,64}(\.[A-Za-z0-9_$]{1,64})?$`)

// New returns a store on db. It does not contact the server. It returns
// an error wrapping [backends.ErrNilClient] for a nil db, and one
// wrapping [backends.ErrInvalidOptions] for a table name MySQL refuses or
// an unknown flavor.
func New(db *sql.DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("mysqlstore: %w", backends.ErrNilClient)
	}
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if !tableRE.MatchString(opts.Table) {
		return nil, fmt.Errorf("mysqlstore: %w: table name %q: [database.]table, each 1 to 64 of A-Z, a-z, 0-9, '_' and '$'", backends.ErrInvalidOptions, opts.Table)
	}
	if opts.Flavor < FlavorDetect || opts.Flavor > FlavorMySQL {
		return nil, fmt.Errorf("mysqlstore: %w: unknown flavor %d", backends.ErrInvalidOptions, int(opts.Flavor))
	}
	if opts.InFlight < 0 {
		return nil, fmt.Errorf("mysqlstore: %w: negative InFlight %d", backends.ErrInvalidOptions, opts.InFlight)
	}
	parts := strings.Split(opts.Table, ".")
	quoted := make([]string, len(parts))
	for i, p := range parts {
		quoted[i] = "`" + p + "`"
	}
	// An index is named within its table, so cutting the table's name to
	// keep the index's within 64 characters cannot make two collide.
	index := parts[len(parts)-1]
	index = index[:min(len(index), 64-len("_fa"))] + "_fa"
	data := sqlData{Table: strings.Join(quoted, "."), Index: "`" + index + "`"}
	data.State.InProgress, data.State.Released, data.State.Completed = stateInProgress, stateReleased, stateCompleted
	data.How.Fresh, data.How.Takeover, data.How.Reentrant, data.How.AfterRelease = howFresh, howTakeover, howReentrant, howAfterRelease
	data.How.Unchanged = howUnchanged
	st, err := renderStatements(data)
	if err != nil {
		// The embedded templates, with any table name: cannot fail.
		return nil, fmt.Errorf("mysqlstore: render statements: %w", err)
	}
	s := &Store{db: db, opts: opts, data: data, sql: st, flavor: opts.Flavor}
	inFlight := opts.InFlight
	if inFlight == 0 {
		inFlight = defaultInFlight(db.Stats().MaxOpenConnections, runtime.GOMAXPROCS(0))
	}
	s.acquires = storekit.NewBatcher(inFlight, maxBatch, s.sendFirst)
	s.completes = storekit.NewBatcher(inFlight, maxBatch, s.sendCompletes)
	return s, nil
}

// defaultInFlight is Options.InFlight's default for a db whose limit on
// open connections is maxOpen (0 for none) in a process of procs Ps: a
// quarter of the limit, at most procs, at least 1. Each statement in
// flight costs the process its send, read and wakeups, and MariaDB a
// statement and a commit: past as many as the process has CPUs, more of
// them only make the batches smaller.
func defaultInFlight(maxOpen, procs int) int {
	if maxOpen == 0 {
		return max(1, procs)
	}
	return max(1, min(maxOpen/4, procs))
}

// PoolSize implements [backends.PoolSizer]: the db's limit on open
// connections (sql.DB.SetMaxOpenConns), as it is when called. It is 0
// when the db sets none, database/sql's default: the pool then opens a
// connection for every call, and the middleware falls back to its
// default bound on acquisitions. Set a limit, and the middleware lets new
// acquisitions take at most half of it by default.
func (s *Store) PoolSize() int { return s.db.Stats().MaxOpenConnections }

// Options returns the store's options with defaults applied, but for an
// InFlight of 0, which stays 0: its default depends on the db.
func (s *Store) Options() Options { return s.opts }

// MigrationSQL returns the SQL that creates the table, for an external
// migration tool: the statement Migrate runs first, ended with ';'. A
// table of an earlier release also needs the columns Migrate adds to it;
// docs/upgrading.md gives the ALTER TABLE.
func (s *Store) MigrationSQL() string {
	return strings.TrimRight(s.sql.schema.sql, "\n") + ";\n"
}

// Schema returns what [Store.MigrationSQL] returns.
//
// Deprecated: use MigrationSQL, the name pgstore has for it too.
func (s *Store) Schema() string { return s.MigrationSQL() }

// Migrate creates the table if it does not exist, and adds to a table of
// an earlier release the columns added since (origin, acquired_us). It
// is idempotent and safe to call from several instances at once: they
// take a named lock, waiting for it at most a minute, or until ctx's
// deadline if that is sooner.
//
// The columns are added at the end of the table, which MariaDB 10.3+ and
// MySQL 8.0.12+ do instantly, rewriting no row; but ALTER TABLE needs the
// table's metadata lock for a moment, and while it waits for that lock
// (behind a transaction that holds the table, such as a handler's, open
// around CompleteTx) every call on the table queues behind it. So Migrate
// waits for the lock at most a second at a time (lock_wait_timeout, whose
// least value is a second), and tries again after a pause, for up to a
// minute (or until ctx is done), before it returns the lock wait timeout
// as its error.
func (s *Store) Migrate(ctx context.Context) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("mysqlstore: migrate: %w", err)
	}
	defer conn.Close()
	// GET_LOCK names are server-wide: an unqualified table is named with
	// the connection's database, so that its instances share one lock
	// with those that name the table qualified, and not with another
	// database's table of the same name.
	qualified := s.opts.Table
	if !strings.Contains(qualified, ".") {
		var db sql.NullString
		if err := conn.QueryRowContext(ctx, s.sql.database.sql).Scan(&db); err != nil {
			return opError("migrate", err)
		}
		qualified = db.String + "." + qualified
	}
	lock := migrateLock(qualified)
	wait := migrateLockWait
	if deadline, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(deadline))
	}
	seconds := max(int64(wait/time.Second), 0) // GET_LOCK's timeout is whole seconds; 0 tries once
	p := params{lock: lock, seconds: seconds}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, s.sql.getLock.sql, s.sql.getLock.args(&p)...).Scan(&got); err != nil {
		return opError("migrate: lock", err)
	}
	if !got.Valid || got.Int64 != 1 {
		// 0: another session held the lock all along; NULL: the wait
		// failed on the server (it was killed, say).
		answer := "NULL"
		if got.Valid {
			answer = fmt.Sprint(got.Int64)
		}
		return fmt.Errorf("mysqlstore: migrate: lock %q for %s not taken within %ds: GET_LOCK returned %s", lock, qualified, seconds, answer)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), s.sql.releaseLock.sql, s.sql.releaseLock.args(&p)...) //nolint:errcheck
	if _, err := conn.ExecContext(ctx, s.sql.schema.sql); err != nil {
		return opError("migrate", err)
	}
	return s.addColumns(ctx, conn)
}

// addedColumns are the columns added since the table's first release,
// with their definitions, in the order they are added.
var addedColumns = [][2]string{
	{"origin", "VARBINARY(255) NULL"},
	{"acquired_us", "BIGINT NULL"},
}

// addColumns adds to the table the addedColumns it lacks, on conn, which
// holds Migrate's lock. See Migrate for how it waits for the table.
func (s *Store) addColumns(ctx context.Context, conn *sql.Conn) error {
	p := params{table: s.opts.Table}
	if db, table, ok := strings.Cut(s.opts.Table, "."); ok {
		p.database.String, p.database.Valid, p.table = db, true, table
	}
	rows, err := conn.QueryContext(ctx, s.sql.columns.sql, s.sql.columns.args(&p)...)
	if err != nil {
		return opError("migrate", err)
	}
	have := map[string]bool{}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			rows.Close()
			return opError("migrate", err)
		}
		have[strings.ToLower(c)] = true
	}
	if err := rows.Err(); err != nil {
		return opError("migrate", err)
	}
	data := s.data
	for _, c := range addedColumns {
		if !have[c[0]] {
			data.Add = append(data.Add, c)
		}
	}
	if len(data.Add) == 0 {
		return nil
	}
	r, err := newRenderer(data)
	if err != nil {
		return opError("migrate", err)
	}
	alter, err := r.render("add columns")
	if err != nil {
		return opError("migrate", err)
	}
	if _, err := conn.ExecContext(ctx, s.sql.shortLockWait.sql); err != nil {
		return opError("migrate", err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), s.sql.defaultLockWait.sql) //nolint:errcheck
	giveUp := time.Now().Add(migrateLockWait)
	for try := 0; ; try++ {
		_, err := conn.ExecContext(ctx, alter.sql)
		var myErr *mysql.MySQLError
		if err == nil || !errors.As(err, &myErr) || myErr.Number != errLockWait {
			if err != nil {
				return opError("migrate", err)
			}
			return nil
		}
		pause := rand.N(min(10*time.Millisecond<<try, time.Second)) + time.Millisecond
		if time.Now().Add(pause).After(giveUp) {
			return fmt.Errorf("mysqlstore: migrate: the table stayed locked for %v: a transaction holds it: %w", migrateLockWait, err)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("mysqlstore: migrate: %w", errors.Join(err, ctx.Err()))
		case <-t.C:
		}
	}
}

// migrateLockWait bounds how long Migrate waits for another instance's
// migration of the same table.
const migrateLockWait = time.Minute

// migrateLock names Migrate's lock for a qualified table name. MySQL
// rejects lock names longer than 64 characters (error 3057), and a
// qualified name can have 129, so the name is a digest behind a prefix
// that says whose lock it is.
func migrateLock(qualified string) string {
	sum := sha256.Sum256([]byte(qualified))
	return "mysqlstore:migrate:" + hex.EncodeToString(sum[:20])
}

// stmt returns query prepared on s.db, preparing it on first use. A
// prepared statement is parsed by the server once per connection and
// then sent as its id and arguments, one round trip; a query with
// arguments that is not prepared costs, with the driver's defaults, a
// prepare, an execute and a close, two round trips and a parse, every
// time. database/sql prepares the statement again on each connection
// that runs it.
func (s *Store) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st, ok := s.prepared.Load(query); ok {
		return st.(*sql.Stmt), nil
	}
	st, err := s.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if old, loaded := s.prepared.LoadOrStore(query, st); loaded {
		_ = st.Close() // another call prepared it meanwhile
		return old.(*sql.Stmt), nil
	}
	return st, nil
}

// detectFlavor returns the dialect the store uses, detecting it if it was
// not given and has not been yet.
func (s *Store) detectFlavor(ctx context.Context) (Flavor, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.flavor != FlavorDetect {
		return s.flavor, nil
	}
	var version string
	if err := s.db.QueryRowContext(ctx, s.sql.version.sql).Scan(&version); err != nil {
		return FlavorDetect, opError("detect flavor", err)
	}
	s.flavor = flavorOf(version)
	return s.flavor, nil
}

// flavorOf reads a VERSION() string: MariaDB from 10.5 has RETURNING.
func flavorOf(version string) Flavor {
	if !strings.Contains(strings.ToLower(version), "mariadb") {
		return FlavorMySQL
	}
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err != nil || major < 10 || major == 10 && minor < 5 {
		return FlavorMySQL
	}
	return FlavorMariaDB
}

// MySQL error numbers the store acts on.
const (
	errDuplicateKey = 1062
	errLockWait     = 1205
	errDeadlock     = 1213
)

// opError wraps a failed call's error, marking with [backends.ErrRejected]
// the server errors that retrying cannot fix.
func opError(op string, err error) error {
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) && rejected(myErr.Number) {
		return fmt.Errorf("mysqlstore: %s: %w: %w", op, backends.ErrRejected, err)
	}
	return fmt.Errorf("mysqlstore: %s: %w", op, err)
}

// rejected reports whether a server error is one retrying cannot fix:
// access denied (1044, 1045, 1142, 1143), no database or table (1046,
// 1049, 1146), an unknown column or a syntax error (1054, 1064), a value
// the column or the packet cannot hold (1153, 1366, 1406). Lock waits,
// deadlocks, lost connections and read-only errors during a failover are
// transient.
func rejected(n uint16) bool {
	switch n {
	case 1044, 1045, 1046, 1049, 1054, 1064, 1142, 1143, 1146, 1153, 1366, 1406:
		return true
	}
	return false
}

// retryable reports whether err is a deadlock or a lock wait timeout. The
// server rolled back the statement (1205) or its transaction (1213); for
// the store's own statements, and for Acquire's transaction, which is
// rolled back and run whole, running them again is safe.
func retryable(err error) bool {
	var myErr *mysql.MySQLError
	return errors.As(err, &myErr) && (myErr.Number == errDeadlock || myErr.Number == errLockWait)
}

// maxTries bounds how often a statement that deadlocked is run again.
const maxTries = 4

// retry runs fn again while it deadlocks, at most maxTries times.
func retry(ctx context.Context, fn func() error) error {
	var err error
	for i := range maxTries {
		if err = fn(); !retryable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(i+1) * 5 * time.Millisecond):
		}
	}
	return err
}

// us converts d to whole microseconds, rounding up, so a lease is never
// shorter than asked for.
func us(d time.Duration) int64 { return int64((d + time.Microsecond - 1) / time.Microsecond) }

// Acquire implements [backends.Store]. On MariaDB it first sends the
// insert of a new record ("acquire first"), together with the calls that
// queued meanwhile (Options.InFlight), and the upsert only for a record
// the insert leaves to it; on MySQL the insert alone, and for a key with a
// record the upsert and a read of the row in one transaction.
func (s *Store) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	if err := storekit.ValidateAcquire(req); err != nil {
		return backends.AcquireResult{}, err
	}
	flavor, err := s.detectFlavor(ctx)
	if err != nil {
		return backends.AcquireResult{}, err
	}
	var fp any
	if req.Fingerprint != nil {
		fp = req.Fingerprint
	}
	var origin any
	if req.Origin != "" {
		origin = []byte(req.Origin)
	}
	p := params{key: []byte(req.Key), owner: []byte(req.Owner), ttl: us(req.LeaseTTL), ret: us(req.Retention), fp: fp, origin: origin}
	var row acquired
	err = retry(ctx, func() error {
		if flavor != FlavorMariaDB {
			return s.acquireMySQL(ctx, &p, &row)
		}
		c := acquireCall{ctx: ctx, p: &p}
		if err := s.acquires.Do(ctx, &c); err != nil {
			return err
		}
		if c.err != nil {
			return c.err
		}
		row = c.row
		if row.settled(req) {
			return nil
		}
		st, err := s.stmt(ctx, s.sql.acquireReturning.sql)
		if err != nil {
			return err
		}
		return row.scan(st.QueryRowContext(ctx, s.sql.acquireReturning.args(&p)...))
	})
	if err != nil {
		return backends.AcquireResult{}, opError("acquire", err)
	}
	return row.result(req)
}

// acquireMySQL runs Acquire where there is no RETURNING: first the plain
// insert of a new record, which answers a new key in one statement; when
// the key has a record (a duplicate key, 1062), the upsert and a read of
// the row it left, in one transaction.
func (s *Store) acquireMySQL(ctx context.Context, p *params, row *acquired) error {
	insert, err := s.stmt(ctx, s.sql.acquireInsert.sql)
	if err != nil {
		return err
	}
	_, err = insert.ExecContext(ctx, s.sql.acquireInsert.args(p)...)
	var myErr *mysql.MySQLError
	switch {
	case err == nil:
		fp, _ := p.fp.([]byte)
		*row = acquired{state: stateInProgress, how: howFresh, owner: p.owner, token: 1, attempt: 1, fingerprint: fp}
		return nil
	case !errors.As(err, &myErr) || myErr.Number != errDuplicateKey:
		return err
	}
	return s.acquireInTx(ctx, p, row)
}

// acquireInTx runs the upsert and reads the row it left in one
// transaction, each statement prepared once: the upsert locked the row,
// so the read sees this call's outcome.
func (s *Store) acquireInTx(ctx context.Context, p *params, row *acquired) error {
	upsert, err := s.stmt(ctx, s.sql.acquire.sql)
	if err != nil {
		return err
	}
	read, err := s.stmt(ctx, s.sql.acquireRead.sql)
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.StmtContext(ctx, upsert).ExecContext(ctx, s.sql.acquire.args(p)...); err != nil {
		return err
	}
	if err := row.scan(tx.StmtContext(ctx, read).QueryRowContext(ctx, s.sql.acquireRead.args(p)...)); err != nil {
		return err
	}
	return tx.Commit()
}

// acquired is the row an Acquire left, as statements.sql's "acquired
// columns" reads it; "acquire first" reads two columns more.
type acquired struct {
	state, how          int16
	owner               []byte
	token               int64
	attempt             int32
	leaseUs, nowUs      int64
	completedUs         sql.NullInt64
	fingerprint, output []byte

	acquiredUs sql.NullInt64 // when the record's lease was acquired
	live       bool          // whether the record still counts
}

func (a *acquired) scan(row *sql.Row) error {
	return row.Scan(&a.state, &a.owner, &a.token, &a.attempt, &a.how, &a.leaseUs, &a.completedUs, &a.fingerprint, &a.output, &a.nowUs)
}

// scanFirst reads a row of "acquire first", whose first column, the
// key, goes to key.
func (a *acquired) scanFirst(row scanner, key *[]byte) error {
	return row.Scan(key, &a.state, &a.owner, &a.token, &a.attempt, &a.how, &a.leaseUs, &a.completedUs, &a.fingerprint, &a.output, &a.nowUs,
		&a.acquiredUs, &a.live)
}

// settled reports whether the row "acquire first" returned answers req
// as the upsert would have, so that the upsert need not run.
//
// A row of req's owner acquired at the statement's own time is the one
// the statement inserted. (A lease the owner took in an earlier statement
// started in the same microsecond would pass too, read as new rather than
// reentrant: it has the same token and the same expiry the upsert would
// give it.) Any other row of the owner's is its own lease again, which the
// upsert renews. A row of another owner's is answered as it is while it
// counts, is completed or a live lease, and has a fingerprint or req
// brings none: one past its retention, released or expired, or with a
// fingerprint to adopt, is the upsert's to change.
func (a *acquired) settled(req backends.AcquireRequest) bool {
	if string(a.owner) == req.Owner {
		return a.state == stateInProgress && a.acquiredUs.Valid && a.acquiredUs.Int64 == a.nowUs
	}
	if !a.live || a.fingerprint == nil && req.Fingerprint != nil {
		return false
	}
	switch a.state {
	case stateCompleted:
		return true
	case stateInProgress:
		return a.leaseUs > a.nowUs
	}
	return false
}

func (a *acquired) result(req backends.AcquireRequest) (backends.AcquireResult, error) {
	res := backends.AcquireResult{Fingerprint: nilIfEmpty(a.fingerprint)}
	switch {
	case a.how != howRefused && a.state == stateInProgress && string(a.owner) == req.Owner:
		res.Status = backends.StatusAcquired
		res.Lease = backends.Lease{Key: req.Key, Owner: req.Owner, Token: a.token, Attempt: int(a.attempt), Takeover: a.how == howTakeover}
		res.Reentrant = a.how == howReentrant
	case a.state == stateCompleted:
		res.Status = backends.StatusCompleted
		res.CompletedAt = micros(a.completedUs.Int64)
		res.Output = nilIfEmpty(a.output)
	case a.state == stateInProgress:
		res.Status = backends.StatusInProgress
		res.Remaining = time.Duration(a.leaseUs-a.nowUs) * time.Microsecond
	default:
		return backends.AcquireResult{}, fmt.Errorf("mysqlstore: acquire: record of %q in unexpected state %d (how %d)", req.Key, a.state, a.how)
	}
	return res, nil
}

func micros(v int64) time.Time { return time.UnixMicro(v) }

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// held runs on db an UPDATE that matches only the lease's own live
// record. A server reports the rows an UPDATE changed, not those it
// matched (unless the DSN sets clientFoundRows), so an update that
// changed nothing is checked with a read before it counts as lost.
func (s *Store) held(ctx context.Context, db Execer, op string, st statement, lease backends.Lease, p params) error {
	if err := storekit.ValidateLease(lease); err != nil {
		return err
	}
	p.key, p.owner, p.token = []byte(lease.Key), []byte(lease.Owner), lease.Token
	query, args := st.sql, st.args(&p)
	var n int64
	exec := db.ExecContext
	run := func() error {
		res, err := exec(ctx, query, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	}
	var err error
	if _, own := db.(*sql.DB); own {
		// The store's own pool: the statement prepared, once.
		exec = func(ctx context.Context, query string, args ...any) (sql.Result, error) {
			st, err := s.stmt(ctx, query)
			if err != nil {
				return nil, err
			}
			return st.ExecContext(ctx, args...)
		}
		err = retry(ctx, run) // a statement of its own: rolled back alone, run again
	} else {
		// The caller's transaction: a deadlock rolled all of it back, so a
		// rerun would complete the key alone, outside it; so would one
		// after a lock wait timeout on a server with
		// innodb_rollback_on_timeout=ON. The caller rolls back instead.
		err = run()
	}
	if err != nil {
		return opError(op, err)
	}
	if n == 1 {
		return nil
	}
	q, ok := db.(interface {
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	})
	if !ok {
		return backends.ErrLeaseLost
	}
	var one int
	switch err := q.QueryRowContext(ctx, s.sql.stillHeld.sql, s.sql.stillHeld.args(&p)...).Scan(&one); {
	case errors.Is(err, sql.ErrNoRows):
		return backends.ErrLeaseLost
	case err != nil:
		return opError(op, err)
	}
	return nil // matched, and already as the update would leave it
}

// Renew implements [backends.Store].
func (s *Store) Renew(ctx context.Context, lease backends.Lease, ttl time.Duration) error {
	if err := storekit.ValidateLeaseTTL(ttl); err != nil {
		return err
	}
	return s.held(ctx, s.db, "renew", s.sql.renew, lease, params{ttl: us(ttl)})
}

// Complete implements [backends.Store]. On MariaDB, completions made at
// the same time share a statement, as Acquire calls do.
func (s *Store) Complete(ctx context.Context, lease backends.Lease, output []byte) error {
	flavor, err := s.detectFlavor(ctx)
	if err != nil {
		return err
	}
	if flavor != FlavorMariaDB || len(output) > maxTogetherOutput {
		return s.held(ctx, s.db, "complete", s.sql.complete, lease, params{output: nilOrBytes(output)})
	}
	if err := storekit.ValidateLease(lease); err != nil {
		return err
	}
	c := completeCall{ctx: ctx, lease: lease, p: params{key: []byte(lease.Key), owner: []byte(lease.Owner), token: lease.Token, output: nilOrBytes(output)}}
	if err := s.completes.Do(ctx, &c); err != nil {
		return opError("complete", err)
	}
	return c.err
}

// CompleteTx completes the lease inside tx, the transaction in which the
// handler wrote its own rows, with the messages the handler will return:
// if tx commits, the work, its completion and its output are recorded
// together; if it rolls back, none is, and the key is retried. Take the
// lease from the handler's context (LeaseFromContext in the middleware
// package). The middleware notices that the handler completed the key and
// does not complete it again; a duplicate gets output replayed, so pass
// exactly what the handler returns.
//
// On any error, roll tx back and return the error; the message is
// redelivered. CompleteTx does not run its statement again after a
// deadlock (1213) or a lock wait timeout (1205), as the store's own
// statements are, because the server rolled back different things: after
// a deadlock, the whole transaction, the handler's writes with it (tx is
// gone, and statements after it would run outside any transaction); after
// a lock wait timeout, with InnoDB's default innodb_rollback_on_timeout=OFF,
// only the completion, so tx is still open with the handler's writes, and
// committing it would record the work while leaving the key to be
// processed again.
func (s *Store) CompleteTx(ctx context.Context, tx Execer, lease backends.Lease, output []*message.Message) error {
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
// the key; on any error, roll tx back, as for CompleteTx.
func (s *Store) CompleteTxOutput(ctx context.Context, tx Execer, lease backends.Lease, output []byte) error {
	if tx == nil {
		return fmt.Errorf("mysqlstore: complete: %w: nil transaction", backends.ErrInvalidRequest)
	}
	return s.held(ctx, tx, "complete", s.sql.complete, lease, params{output: nilOrBytes(output)})
}

func nilOrBytes(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

// Release implements [backends.Store].
func (s *Store) Release(ctx context.Context, lease backends.Lease) error {
	return s.held(ctx, s.db, "release", s.sql.release, lease, params{})
}

type scanner interface{ Scan(dest ...any) error }

// scanRecord reads a row of statements.sql's "record columns".
func scanRecord(row scanner) (backends.Record, error) {
	var (
		key, owner, fingerprint, output, origin []byte
		state                                   int16
		attempt                                 int32
		rec                                     backends.Record
		leaseUs, forgetUs, nowUs                int64
		completedUs, acquiredUs                 sql.NullInt64
	)
	if err := row.Scan(&key, &state, &owner, &rec.Token, &attempt, &leaseUs, &completedUs, &forgetUs, &fingerprint, &output, &nowUs,
		&acquiredUs, &origin); err != nil {
		return backends.Record{}, err
	}
	rec.Key, rec.Owner, rec.Attempt, rec.Origin = string(key), string(owner), int(attempt), string(origin)
	rec.LeaseExpiresAt, rec.ExpiresAt = micros(leaseUs), micros(forgetUs)
	rec.Fingerprint, rec.Output = nilIfEmpty(fingerprint), nilIfEmpty(output)
	if acquiredUs.Valid { // NULL in a row an earlier release wrote
		rec.AcquiredAt = micros(acquiredUs.Int64)
	}
	switch {
	case state == stateCompleted:
		rec.State = backends.StateCompleted
		rec.CompletedAt = micros(completedUs.Int64)
	case state == stateReleased:
		rec.State = backends.StateReleased
	case leaseUs > nowUs:
		rec.State = backends.StateInProgress
	default:
		rec.State = backends.StateExpired
	}
	return rec, nil
}

// Inspect implements [backends.Store].
func (s *Store) Inspect(ctx context.Context, key string) (backends.Record, error) {
	if err := storekit.ValidateKey(key); err != nil {
		return backends.Record{}, err
	}
	rec, err := scanRecord(s.db.QueryRowContext(ctx, s.sql.inspect.sql, s.sql.inspect.args(&params{key: []byte(key)})...))
	if errors.Is(err, sql.ErrNoRows) {
		return backends.Record{}, backends.ErrNotFound
	}
	if err != nil {
		return backends.Record{}, opError("inspect", err)
	}
	return rec, nil
}

// Delete implements [backends.Store]: a record past its retention is
// deleted too, but reported as not found, as it already counted as absent.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := storekit.ValidateKey(key); err != nil {
		return err
	}
	p := params{key: []byte(key)}
	var n int64
	err := retry(ctx, func() error {
		res, err := s.db.ExecContext(ctx, s.sql.deleteLive.sql, s.sql.deleteLive.args(&p)...)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	})
	if err != nil {
		return opError("delete", err)
	}
	if n == 1 {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, s.sql.deleteAny.sql, s.sql.deleteAny.args(&p)...); err != nil {
		return opError("delete", err)
	}
	return backends.ErrNotFound
}

// Cleanup deletes up to batch records past their retention, oldest first,
// and returns how many it deleted; a record completed within its lease
// once its lease's end plus the retention has passed too. Records past
// their retention already count as absent, so cleanup only reclaims
// space; it never changes what the store answers.
func (s *Store) Cleanup(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		return 0, fmt.Errorf("%w: batch must be positive, got %d", backends.ErrInvalidRequest, batch)
	}
	var n int64
	err := retry(ctx, func() error {
		res, err := s.db.ExecContext(ctx, s.sql.cleanup.sql, s.sql.cleanup.args(&params{batch: batch})...)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	})
	if err != nil {
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
