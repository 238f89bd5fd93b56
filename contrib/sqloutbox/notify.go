package sqloutbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// How the Forwarder hears of rows that other processes commit: Migrate
// puts a trigger on the outbox table that runs pg_notify for each INSERT
// statement, so that every writer (this library's WithTx and Handler, or
// a plain watermill-sql publisher) notifies; Postgres delivers the
// notification when, and only if, the transaction commits. The Forwarder
// listens on a connection of its own.

// notifyFunction is the trigger function Migrate creates: it notifies the
// channel its trigger names.
const notifyFunction = `CREATE OR REPLACE FUNCTION sqloutbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify(TG_ARGV[0], '');
	RETURN NULL;
END
$$`

// migrateLock serialises Migrate across processes: CREATE OR REPLACE
// FUNCTION run at once by two transactions fails in one of them.
const migrateLock = `SELECT pg_advisory_xact_lock(7536011302512217455)`

// notifyTrigger creates the trigger on table, unless it is there: a
// second Migrate takes no lock on the table. It notifies unless the
// transaction set sqloutbox.quiet (quietBegin).
func notifyTrigger(table, channel string) string {
	return `DO $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = ` + literal(table) + `::regclass AND tgname = 'sqloutbox_notify') THEN
		CREATE TRIGGER sqloutbox_notify AFTER INSERT ON ` + table + ` FOR EACH STATEMENT
			WHEN (current_setting('sqloutbox.quiet', true) IS DISTINCT FROM 'on')
			EXECUTE FUNCTION sqloutbox_notify(` + literal(channel) + `);
	END IF;
END
$$`
}

// quietBegin begins a transaction whose writes to the outbox notify no
// one: WithTx's when a Forwarder of the outbox runs in the process, which
// its commit wakes. One round trip, as BEGIN alone.
const quietBegin = `BEGIN; SET LOCAL sqloutbox.quiet = 'on'`

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// channel is the notification channel of an outbox topic: at most 63
// bytes, the longest name Postgres keeps.
func channel(topic string) string {
	c := "sqloutbox:" + topic
	if len(c) <= 63 {
		return c
	}
	sum := sha256.Sum256([]byte(topic))
	return "sqloutbox:" + hex.EncodeToString(sum[:16])
}

// acquirer is a pool the Forwarder can take its listening connection
// from: *pgxpool.Pool.
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// listenRetry is the first wait before the listening connection is made
// again after it failed; the waits double up to maxListenRetry.
const (
	listenRetry    = 100 * time.Millisecond
	maxListenRetry = 10 * time.Second
)

// A listening connection silent for listenIdle is pinged, and dropped if
// the ping takes longer than listenPing: a connection cut without a word
// (a dead peer, a firewall) would otherwise never fail.
const (
	listenIdle = 15 * time.Second
	listenPing = 5 * time.Second
)

// listen keeps a connection taken out of pool listening on ch until ctx
// ends, and calls wake for each notification and after each connection:
// rows may have been committed while nobody listened. When the connection
// fails it makes another, after a wait that doubles from listenRetry to
// maxListenRetry; the Forwarder's poll covers the gap.
func listen(ctx context.Context, pool acquirer, ch string, wake func(), logger watermill.LoggerAdapter) {
	retry := listenRetry
	for {
		heard, err := listenOnce(ctx, pool, ch, wake)
		if ctx.Err() != nil {
			return
		}
		if heard {
			retry = listenRetry
		}
		logger.Error("sqloutbox: the Forwarder's notification connection failed; its poll covers until it is back", err,
			watermill.LogFields{"channel": ch, "retry_in": retry})
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		retry = min(2*retry, maxListenRetry)
	}
}

// listenOnce listens on one connection until it fails; heard is whether
// it got as far as listening.
func listenOnce(ctx context.Context, pool acquirer, ch string, wake func()) (heard bool, err error) {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquiring a connection: %w", err)
	}
	conn := pc.Hijack() // the pool makes another for its users
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	stmt := "LISTEN " + pgx.Identifier{ch}.Sanitize()
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return false, fmt.Errorf("LISTEN: %w", err)
	}
	wake()
	for {
		wait, cancel := context.WithTimeout(ctx, listenIdle)
		_, err := conn.WaitForNotification(wait)
		idle := wait.Err() != nil
		cancel()
		switch {
		case err == nil:
			wake()
		case ctx.Err() != nil:
			return true, ctx.Err()
		case idle && !conn.IsClosed():
			// pg_stat_activity shows the ping as the LISTEN it keeps.
			ping, cancel := context.WithTimeout(ctx, listenPing)
			_, err := conn.Exec(ping, "-- "+stmt)
			cancel()
			if err != nil {
				return true, fmt.Errorf("ping: %w", err)
			}
		default:
			return true, err
		}
	}
}
