package pgstore

import (
	"context"
	"crypto/md5" //nolint:gosec // names a key in a notification, as md5() does in SQL; no security role
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

var _ backends.Watcher = (*Store)(nil)

// How the listener behind Watch keeps its connection.
const (
	// listenConnect bounds taking a connection from the pool and
	// running LISTEN on it.
	listenConnect = 10 * time.Second
	// listenPing bounds the ping of a connection silent for listenIdle;
	// a connection that does not answer in time counts as lost.
	listenPing = 5 * time.Second
	// After a lost connection, or a failed attempt at one, Watch reports
	// not ok (its callers poll) while the listener tries again after a
	// backoff that doubles from minRelisten to maxRelisten and starts
	// again at the next connection that listens.
	minRelisten = 50 * time.Millisecond
	maxRelisten = 5 * time.Second
)

// listenIdle is how long the listener's connection may stay silent before
// it is pinged; a variable for the tests.
var listenIdle = 15 * time.Second

// channelName is the NOTIFY channel of a table: "idempotency_" and the
// first 16 hex digits of the SHA-256 of its quoted, schema-qualified name
// (as pgx.Identifier.Sanitize writes it), 28 bytes whatever the names.
func channelName(table string) string {
	sum := sha256.Sum256([]byte(table))
	return "idempotency_" + hex.EncodeToString(sum[:8])
}

// payloadOf is a key's notification payload: the hex MD5 of its bytes,
// as md5(key) computes it in SQL.
func payloadOf(key string) string {
	sum := md5.Sum([]byte(key)) //nolint:gosec // see the import
	return hex.EncodeToString(sum[:])
}

// Watch implements [backends.Watcher] with LISTEN/NOTIFY. It marks the
// row of the key's lease in progress as waited for (the waited column)
// and returns once that is committed and the store's listener is
// listening on the table's channel: the row's next completion, release or
// deletion then notifies the channel in the same statement, delivered
// when that statement's transaction commits (a CompleteTx that rolls back
// notifies nothing), and clears the mark. The channel is "idempotency_"
// and 16 hex digits of the SHA-256 of the quoted, schema-qualified table
// name, the same for every store on the table; the payload is the hex MD5
// of the key. Cleanup notifies too, for a marked record it deletes. A key
// nobody watches is never notified, so callers that find no duplicates
// pay for no NOTIFY. A key
// without a lease in progress (absent, completed, released, or its lease
// run out) has nothing to wait for: changed is closed at once, and the
// caller asks the store again.
//
// Each store listens on one connection of its own, taken from its pool
// on the first Watch and then owned by the store (pgxpool's Hijack: it
// leaves the pool, which may open another in its place); call
// [Store.Close] to end it. A store with [WakePoll] does not watch: Watch
// reports not ok and the middleware polls.
//
// The first Watch waits, within ctx, for the listener to connect. A lost
// listener connection (a restart, a failover, pg_terminate_backend) or
// one silent that does not answer a ping wakes every watch, since it may
// have missed a notification; until the listener listens again Watch
// reports not ok at once.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	l := s.listener
	if l == nil {
		return nil, func() {}, false
	}
	id := payloadOf(key)
	w, ok := l.add(ctx, id)
	if !ok {
		return nil, func() {}, false
	}
	marked, err := s.mark(ctx, key)
	if err != nil {
		w.Stop()
		return nil, func() {}, false
	}
	if !marked {
		w.Wake() // the caller looks at the store again
	}
	return w.Changed(), w.Stop, true
}

// mark sets the waited mark on the row of key's lease in progress, unless
// it is set already, and reports whether the row has it now; false if
// the key holds no lease in progress. A mark is cleared only by a
// statement that notifies; the listener listened before this statement's
// snapshot, so it receives the notification of any statement that
// clears a mark this one sees set.
func (s *Store) mark(ctx context.Context, key string) (bool, error) {
	for range 3 {
		var (
			set    bool
			before *bool
		)
		if err := s.pool.QueryRow(ctx, s.sql.watch, []byte(key)).Scan(&set, &before); err != nil {
			return false, opError("watch", err)
		}
		switch {
		case set || before != nil && *before:
			return true, nil
		case before == nil:
			return false, nil // no lease in progress
		}
		// Another statement changed the row after this one's snapshot
		// (another watch marked it, or the lease ended): look again.
	}
	return false, nil
}

// Close stops the listener that Watch started, closes its connection and
// wakes every watch; a later Watch reports not ok. The store's other
// calls keep working. Call it when the store is no longer needed if it
// may have watched (the middleware watches whenever a duplicate waits):
// until then the listener's goroutine and connection stay. It is
// idempotent, and does nothing else on a store that never watched. It
// does not close the pool.
func (s *Store) Close() error {
	if s.listener != nil {
		s.listener.close()
	}
	return nil
}

// listener is a store's LISTEN connection and the watches it serves.
type listener struct {
	pool    *pgxpool.Pool
	channel string
	// listen is the LISTEN statement, ping the same as a comment, so
	// that pg_stat_activity shows the connection's purpose either way.
	listen, ping string
	idle         time.Duration

	mu     sync.Mutex
	state  listenState
	ready  chan struct{}      // closed when the first connection attempt ends
	cancel context.CancelFunc // ends the goroutine; nil until started
	done   chan struct{}      // closed when the goroutine has ended
	// wakes are the watches, by the key's payload. A watch is added, and
	// every watch woken on a loss, under mu, so that no watch is added
	// after the loss that woke the others.
	wakes storekit.Wakes
}

type listenState int

const (
	notStarted listenState = iota
	starting               // the first connection attempt runs
	listening
	down // lost; the goroutine tries again
	closed
)

func newListener(pool *pgxpool.Pool, channel, listen, ping string) *listener {
	return &listener{pool: pool, channel: channel, listen: listen, ping: ping, idle: listenIdle}
}

// add registers a watch of the key with payload id while the listener
// listens, starting it if needed and waiting, within ctx, for its first
// connection attempt.
func (l *listener) add(ctx context.Context, id string) (*storekit.Watch, bool) {
	l.mu.Lock()
	if l.state == notStarted {
		var run context.Context
		run, l.cancel = context.WithCancel(context.Background())
		l.state, l.ready, l.done = starting, make(chan struct{}), make(chan struct{})
		go l.run(run)
	}
	for l.state == starting {
		ready := l.ready
		l.mu.Unlock()
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, false
		}
		l.mu.Lock()
	}
	defer l.mu.Unlock()
	if l.state != listening {
		return nil, false
	}
	return l.wakes.Add(id), true
}

// wake wakes every watch of id.
func (l *listener) wake(id string) { l.wakes.Wake(id) }

// setState moves to state, unless the listener is closed; leaving
// starting ends the first attempt's wait.
func (l *listener) setState(state listenState) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == closed {
		return false
	}
	if l.state == starting {
		close(l.ready)
	}
	l.state = state
	return true
}

// lose marks the listener down and wakes every watch: they may have
// missed a notification.
func (l *listener) lose() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wakes.WakeAll()
	if l.state == closed {
		return
	}
	if l.state == starting {
		close(l.ready)
	}
	l.state = down
}

func (l *listener) close() {
	l.mu.Lock()
	if l.state == starting {
		close(l.ready)
	}
	l.state = closed
	l.wakes.WakeAll()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// run connects, listens and wakes watches until ctx ends, connecting
// again after a backoff whenever the connection is lost.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff := minRelisten
	for {
		conn, err := l.connect(ctx)
		if err == nil {
			if l.setState(listening) {
				backoff = minRelisten
				l.serve(ctx, conn)
			}
			closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(closeCtx)
			cancel()
		}
		l.lose()
		timer := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		backoff = min(2*backoff, maxRelisten)
	}
}

// connect takes a connection out of the pool and listens on it.
func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, listenConnect)
	defer cancel()
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, l.listen); err != nil {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
		return nil, err
	}
	return conn, nil
}

// serve wakes the watches of every key notified on conn, pinging it after
// l.idle of silence, until ctx ends or the connection fails.
func (l *listener) serve(ctx context.Context, conn *pgx.Conn) {
	for {
		wait, cancel := context.WithTimeout(ctx, l.idle)
		n, err := conn.WaitForNotification(wait)
		idle := wait.Err() != nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			if n.Channel == l.channel {
				l.wake(n.Payload)
			}
		case idle && !conn.IsClosed():
			ping, cancel := context.WithTimeout(ctx, listenPing)
			_, err := conn.Exec(ping, l.ping)
			cancel()
			if err != nil {
				return
			}
		default:
			return
		}
	}
}
