package pgstore

import (
	"embed"
	"fmt"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

// The codes of the table's state column. They are stored in the table,
// and read by every release and instance that shares it (a rolling
// upgrade runs two releases on one table): never change them.
const (
	// stateInProgress is a lease, live until lease_expires_at and expired
	// from then on ([backends.StateInProgress], [backends.StateExpired]).
	stateInProgress = 1
	// stateReleased is a lease released by its owner.
	stateReleased = 2
	// stateCompleted is a key completed, with its completion time and
	// output.
	stateCompleted = 3
)

// The codes of the table's how column, which the acquire function
// returns: how the owner of a lease took it. Stored in the table like
// the state codes: never change them.
const (
	// howFresh is a lease on a key that held no lease: a new key, a
	// released one, or one past its retention.
	howFresh = 0
	// howTakeover is a lease taken over from another lease that ran out.
	howTakeover = 1
	// howReentrant is the owner's own live lease, given back to it.
	howReentrant = 2
)

// sqlFiles are the store's SQL templates: schema.sql (the table),
// acquire.sql (the acquire function) and statements.sql (every other
// statement, and the fragments they share).
//
//go:embed *.sql
var sqlFiles embed.FS

// sqlTemplates is sqlFiles parsed, once. Each file is a template named
// after it, and each {{define}} in them a template of its own.
var sqlTemplates = parseSQL()

func parseSQL() *template.Template {
	var t *template.Template
	t = template.Must(template.New("pgstore").Funcs(template.FuncMap{
		// literal quotes a string as an SQL string literal.
		"literal": quoteLiteral,
		// ident quotes a name as an SQL identifier.
		"ident": func(name string) string { return pgx.Identifier{name}.Sanitize() },
		// include renders the template name with data, as a value: for
		// a literal made of a rendered fragment.
		"include": func(name string, data any) (string, error) {
			var b strings.Builder
			err := t.ExecuteTemplate(&b, name, data)
			return b.String(), err
		},
	}).ParseFS(sqlFiles, "*.sql"))
	return t
}

// sqlData is what the SQL templates render: names quoted as SQL
// identifiers, and the codes of the state and how columns.
type sqlData struct {
	// Schema is the store's schema.
	Schema string
	// Table is the records' table, schema-qualified.
	Table string
	// Index is the table's forget_at index, unqualified (CREATE INDEX
	// puts it in the table's schema), and QualifiedIndex the same,
	// schema-qualified.
	Index, QualifiedIndex string
	// Live is the liveness function (schema.sql), schema-qualified.
	Live string
	// Acquire is the table's acquire function (acquire.sql),
	// schema-qualified.
	Acquire string
	// Unlogged is "UNLOGGED" or empty.
	Unlogged string
	// Channel is the table's NOTIFY channel, unquoted (see channelName).
	Channel string
	// AddedColumns are the columns schema.sql adds to a table of an
	// earlier release: Migrate has nothing to do only if each exists.
	AddedColumns []string
	// LockTimeout is the lock_timeout Migrate sets (MigrateLockTimeout).
	LockTimeout string
	// State holds the state column's codes, How the how column's.
	State struct{ InProgress, Released, Completed int }
	How   struct{ Fresh, Takeover, Reentrant int }
	// Row is the alias of the row a fragment speaks of, with its dot
	// ("r."), or empty; set by WithRow.
	Row string
}

// WithRow returns d for a fragment on the row aliased row ("r."; empty
// for the statement's only table): {{template "until" (.WithRow "r.")}}.
func (d sqlData) WithRow(row string) sqlData {
	d.Row = row
	return d
}

// newSQLData returns the templates' data for a store with opts, its
// defaults applied.
func newSQLData(opts Options) sqlData {
	d := sqlData{
		Schema:         pgx.Identifier{opts.Schema}.Sanitize(),
		Table:          pgx.Identifier{opts.Schema, opts.Table}.Sanitize(),
		Index:          pgx.Identifier{opts.Table + indexSuffix}.Sanitize(),
		QualifiedIndex: pgx.Identifier{opts.Schema, opts.Table + indexSuffix}.Sanitize(),
		Live:           pgx.Identifier{opts.Schema, liveFunc}.Sanitize(),
		Acquire:        pgx.Identifier{opts.Schema, opts.Table + acquireSuffix}.Sanitize(),
		AddedColumns:   addedColumns,
		LockTimeout:    fmt.Sprintf("%dms", MigrateLockTimeout.Milliseconds()),
	}
	d.Channel = channelName(d.Table)
	if opts.Unlogged {
		d.Unlogged = "UNLOGGED"
	}
	d.State.InProgress, d.State.Released, d.State.Completed = stateInProgress, stateReleased, stateCompleted
	d.How.Fresh, d.How.Takeover, d.How.Reentrant = howFresh, howTakeover, howReentrant
	return d
}

// statements are the store's SQL, rendered for its options.
type statements struct {
	// schema creates the table (schema.sql); functions creates the
	// acquire function (acquire.sql); current tells whether Migrate has
	// work; lock and lockTimeout begin its transaction.
	schema, functions, current, lock, lockTimeout string
	// The statements of the store's calls.
	acquire, renew, complete, release, inspect, list, count, delete, cleanup, watch string
	// listen is the listener's LISTEN, and ping the same as a comment.
	listen, ping string
}

// render renders every statement from data.
func render(data sqlData) (statements, error) {
	var s statements
	for _, st := range []struct {
		name string
		dst  *string
	}{
		{"schema.sql", &s.schema},
		{"acquire.sql", &s.functions},
		{"current", &s.current},
		{"migration lock", &s.lock},
		{"lock timeout", &s.lockTimeout},
		{"acquire", &s.acquire},
		{"renew", &s.renew},
		{"complete", &s.complete},
		{"release", &s.release},
		{"inspect", &s.inspect},
		{"list", &s.list},
		{"count", &s.count},
		{"delete", &s.delete},
		{"cleanup", &s.cleanup},
		{"watch", &s.watch},
		{"listen", &s.listen},
		{"ping", &s.ping},
	} {
		var b strings.Builder
		if err := sqlTemplates.ExecuteTemplate(&b, st.name, data); err != nil {
			return statements{}, fmt.Errorf("render %s: %w", st.name, err)
		}
		*st.dst = b.String()
	}
	return s, nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
