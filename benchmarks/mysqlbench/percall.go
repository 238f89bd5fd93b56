package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/benchmarks/internal/load"
)

// perCallCalls is how many calls of each kind one round of perCall makes.
const perCallCalls = 3000

// perCall measures the server CPU of each kind of store call on its own:
// one connection, each kind of call perCallCalls times a round, in the
// order a key lives them: an Acquire of a fresh key, its Complete, then
// an Acquire of the completed key by another owner (a duplicate). Beside
// them, what such a row costs without the store's statements: an INSERT
// IGNORE of a row of the same columns (its times constants) into the
// same table; and the two statements of
// e2ebench's hand-written lease (mysql-insert), prepared, on a table like
// its own (a key, a flag, an expiry; no other index): its claim of a
// fresh key and its completion. table is the store's table, which
// Migrate created. It returns the median per call of each, in the order
// of perCallKinds.
func perCall(ctx context.Context, dsn, table string, server serverCPU, rounds int) ([]time.Duration, error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	s, err := mysqlstore.New(db, mysqlstore.Options{Table: table})
	if err != nil {
		return nil, err
	}
	peer := "`" + table + "_peer`"
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+peer+" (`key` VARBINARY(255) PRIMARY KEY, done BOOLEAN NOT NULL DEFAULT FALSE, expires_at DATETIME(6) NOT NULL)"); err != nil {
		return nil, err
	}
	defer db.ExecContext(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+peer) //nolint:errcheck
	var stmts []*sql.Stmt
	defer func() {
		for _, st := range stmts {
			_ = st.Close()
		}
	}()
	prepare := func(q string) (*sql.Stmt, error) {
		st, err := db.PrepareContext(ctx, q)
		if err == nil {
			stmts = append(stmts, st)
		}
		return st, err
	}
	bare, err := prepare("INSERT IGNORE INTO `" + table + "` (`key`, state, owner, origin, token, attempt, how, acquired_us, lease_expires_us, retention_us, forget_us) " +
		"VALUES (?, 1, ?, ?, 1, 1, 0, 0, 30000000, 3600000000, 3630000000)")
	if err != nil {
		return nil, err
	}
	claim, err := prepare("INSERT IGNORE INTO " + peer + " (`key`, expires_at) VALUES (?, NOW(6) + INTERVAL ? MICROSECOND)")
	if err != nil {
		return nil, err
	}
	finish, err := prepare("UPDATE " + peer + " SET done = TRUE, expires_at = NOW(6) + INTERVAL ? MICROSECOND WHERE `key` = ?")
	if err != nil {
		return nil, err
	}
	return load.PerCall(rounds, perCallCalls, perCallKinds, server.used, func(keys []string) []func(i int) error {
		return append(load.StoreCalls(ctx, s, keys),
			func(i int) error {
				_, err := bare.ExecContext(ctx, []byte(keys[i]+"-bare"), []byte("holder"), []byte(load.Origin(keys[i])))
				return err
			},
			func(i int) error {
				_, err := claim.ExecContext(ctx, []byte(keys[i]), (30 * time.Second).Microseconds())
				return err
			},
			func(i int) error {
				_, err := finish.ExecContext(ctx, time.Hour.Microseconds(), []byte(keys[i]))
				return err
			},
		)
	})
}

// perCallKinds names perCall's measurements, in its order.
var perCallKinds = []string{
	"Acquire, fresh key",
	"Complete",
	"Acquire, completed key (a duplicate)",
	"bare INSERT IGNORE of a row of the same columns, fresh key",
	"mysql-insert's claim (INSERT IGNORE, its own table), fresh key",
	"mysql-insert's completion (UPDATE ... SET done = TRUE)",
}

// printPerCall prints perCall's medians.
func printPerCall(out io.Writer, medians []time.Duration, rounds int) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\nServer CPU per call, one connection, each call alone, %d calls of each a round, median of %d rounds\n\n", perCallCalls, rounds)
	fmt.Fprintln(w, "call\tserver CPU\t")
	for k, kind := range perCallKinds {
		fmt.Fprintf(w, "%s\t%s\t\n", kind, micros(medians[k]))
	}
	return w.Flush()
}
