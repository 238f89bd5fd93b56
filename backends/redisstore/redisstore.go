package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

var (
	_ backends.Store     = (*Store)(nil)
	_ backends.PoolSizer = (*Store)(nil)
	_ backends.Lister    = (*Store)(nil)
)

var (
	//go:embed prelude.lua
	preludeSrc string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed take.lua
	takeSrc string
	//go:embed lease.lua
	leaseSrc string
	//go:embed inspect.lua
	inspectSrc string
	//go:embed delete.lua
	deleteSrc string

	// acquire.lua and inspect.lua share the local functions of
	// prelude.lua: Redis keeps no library between scripts (FUNCTION LOAD
	// needs Redis 7.0), so each carries them. The scripts of every
	// message, take.lua and lease.lua, need none.
	acquireScript = newScript(preludeSrc + acquireSrc)
	takeScript    = newScript(takeSrc)
	leaseScript   = newScript(leaseSrc)
	inspectScript = newScript(preludeSrc + inspectSrc)
	deleteScript  = newScript(deleteSrc)
)

// DefaultPrefix is the default [Options.Prefix].
const DefaultPrefix = "idempotency:"

// Options configures a [Store]. The zero value is ready to use.
type Options struct {
	// Prefix is prepended to every key, to keep the store's records apart
	// from other data in the same Redis. Defaults to DefaultPrefix. Set it
	// to a distinct value per environment or application sharing a server.
	Prefix string
	// Coalescing says how calls that arrive while the store already has
	// round trips in flight are sent. Defaults to CoalesceConcurrent.
	Coalescing Coalescing
}

// Coalescing says how a [Store] sends the calls that arrive while it
// already has round trips in flight (see docs/redis.md). A call that
// finds the store idle is sent at once either way.
type Coalescing int

const (
	// CoalesceConcurrent sends a few calls at once each on its own (up to
	// eight per node), and the calls that arrive while they are all in
	// flight together, in one pipeline, as soon as one ends; while that
	// queue drains, every call joins it, and a queue of four calls or
	// more goes in another pipeline without waiting (up to four in flight
	// per node; more only while they are stuck). The default.
	CoalesceConcurrent Coalescing = iota
	// CoalesceOff sends every call as its own round trip: for a proxy or
	// a Redis-compatible server that mishandles pipelined scripts, or to
	// keep each call's go-redis hooks and metrics per command
	// (ProcessHook) rather than per pipeline.
	CoalesceOff
)

// Store is a [backends.Store] on Redis. Create it with [New].
type Store struct {
	client   redis.UniversalClient
	opts     Options
	prefix   string
	poolSize int
	calls    *coalescer
	watch    watchers
	// noSetGet is set once the server refused SET NX GET (before Redis
	// 7.0): Acquire then always runs acquire.lua.
	noSetGet atomic.Bool
}

// New returns a store on client: a *redis.Client (a Sentinel failover
// client is one), a *redis.ClusterClient or a *redis.Ring, the clients
// redis.NewUniversalClient returns. On each of them the store lists its
// records, reports the pool's size and wakes waiting duplicates. It
// returns an error wrapping [backends.ErrNilClient] for a nil client, and
// one wrapping [backends.ErrInvalidOptions] for another implementation of
// redis.UniversalClient, which the store could not do all of that with
// (instrument a client with go-redis hooks, AddHook, instead of wrapping
// it), or for an unknown Coalescing. It does not contact the server.
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if storekit.IsNil(client) {
		return nil, fmt.Errorf("redisstore: %w", backends.ErrNilClient)
	}
	switch client.(type) {
	case *redis.Client, *redis.ClusterClient, *redis.Ring:
	default:
		return nil, fmt.Errorf("redisstore: %w: a client of type %T: want a *redis.Client, *redis.ClusterClient or *redis.Ring", backends.ErrInvalidOptions, client)
	}
	if opts.Coalescing != CoalesceConcurrent && opts.Coalescing != CoalesceOff {
		return nil, fmt.Errorf("redisstore: %w: unknown Coalescing %d", backends.ErrInvalidOptions, int(opts.Coalescing))
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	ps := poolSize(client)
	return &Store{client: client, opts: opts, prefix: opts.Prefix, poolSize: ps, calls: newCoalescer(client, opts.Coalescing == CoalesceOff, ps)}, nil
}

// Options returns the store's options with defaults applied.
func (s *Store) Options() Options { return s.opts }

// poolSize is the connection pool size of a go-redis client, per node for
// a Cluster or Ring.
func poolSize(c redis.UniversalClient) int {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().PoolSize
	case *redis.ClusterClient:
		return c.Options().PoolSize
	case *redis.Ring:
		return c.Options().PoolSize
	}
	return 0
}

// PoolSize implements [backends.PoolSizer]: the client's PoolSize, per
// node for a Cluster or a Ring. The middleware lets new acquisitions take
// at most half of it by default.
func (s *Store) PoolSize() int { return s.poolSize }

// ms converts d to whole milliseconds, rounding up: Redis keeps time in
// milliseconds, and a lease must never be shorter than asked for.
func ms(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// Acquire implements [backends.Store]. Its fast path is one plain
// command, SET NX PX GET with the fresh record: it takes a new key, and
// answers a completed one with its record (unless the record has no
// fingerprint to compare yet and this call brings one). A released or
// expired key, a lease still live and a re-entrant Acquire take one more
// round trip, take.lua, which compares the record with the one SET
// answered with and sets the next. Anything else (a record that changed
// between the two, a fingerprint to adopt, a record of 0.1.0 or a lease
// 0.2 took) goes to acquire.lua, which reads the record again and
// decides.
func (s *Store) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	if err := storekit.ValidateAcquire(req); err != nil {
		return backends.AcquireResult{}, err
	}
	key := s.prefix + req.Key
	ttl, retention := ms(req.LeaseTTL), ms(req.Retention)
	if !s.noSetGet.Load() {
		v, err := s.calls.do(ctx, key, "set", key, leaseRecord(1, req.Owner, 1, retention, ttl, 0, req.Origin, req.Fingerprint),
			"nx", "px", ttl+retention, "get").Text()
		switch {
		case errors.Is(err, redis.Nil): // the key was new: it is ours
			res := backends.AcquireResult{Status: backends.StatusAcquired,
				Lease: backends.Lease{Key: req.Key, Owner: req.Owner, Token: 1, Attempt: 1}}
			if len(req.Fingerprint) > 0 {
				res.Fingerprint = req.Fingerprint
			}
			return res, nil
		case err == nil:
			rec, err := decodeRecord(v, false)
			if err != nil {
				return backends.AcquireResult{}, fmt.Errorf("redisstore: acquire: %w: %w", backends.ErrRejected, err)
			}
			if rec.state == stateCompleted && (len(rec.fingerprint) > 0 || len(req.Fingerprint) == 0) {
				return completed(rec), nil
			}
			if res, ok, err := s.take(ctx, key, req, v, rec); ok || err != nil {
				return res, err
			}
		case redis.HasErrorPrefix(err, "WRONGTYPE"): // a record of 0.1.0, or not a record: the script tells
		case redis.HasErrorPrefix(err, "syntax error"): // HasErrorPrefix drops the ERR
			// A server before Redis 7.0, where SET takes NX or GET but
			// not both: every Acquire goes to the script.
			s.noSetGet.Store(true)
		default:
			return backends.AcquireResult{}, opError(ctx, "acquire", err)
		}
	}
	vals, err := s.calls.run(ctx, acquireScript, key,
		req.Owner, ttl, retention, req.Fingerprint, ttl+retention, req.Origin).Slice()
	if err != nil {
		return backends.AcquireResult{}, opError(ctx, "acquire", err)
	}
	return parseAcquire(req, vals)
}

// take decides the Acquire of req on key from v, the record SET NX PX GET
// answered with (decoded: rec), in one compare and set, take.lua. ok is
// false when acquire.lua must decide: the record changed since, or the
// call needs what only that script does.
func (s *Store) take(ctx context.Context, key string, req backends.AcquireRequest, v string, rec record) (res backends.AcquireResult, ok bool, err error) {
	ttl, retention := ms(req.LeaseTTL), ms(req.Retention)
	fp := rec.fingerprint
	if len(fp) == 0 {
		fp = req.Fingerprint
	}
	res = backends.AcquireResult{Status: backends.StatusAcquired, Fingerprint: fp}
	var next string
	live := "" // the retention of a lease that may still be live
	switch {
	// acquire.lua decides: a completed record adopts a fingerprint, and so
	// does another owner's lease, live or not; a re-entrant Acquire
	// writes the acquisition time if it is still relative to the expiry.
	case rec.state == stateCompleted,
		rec.state == statePending && rec.owner == req.Owner && rec.acquiredTTL > 0,
		rec.state == statePending && rec.owner != req.Owner && len(rec.fingerprint) == 0 && len(req.Fingerprint) > 0:
		return res, false, nil
	case rec.state == statePending && rec.owner == req.Owner:
		// The owner's own lease, extended: it keeps its acquisition time
		// and origin.
		res.Lease, res.Reentrant = rec.lease(req.Key), true
		next = leaseRecord(rec.token, rec.owner, rec.attempt, retention, 0, rec.acquired, rec.origin, fp)
	default:
		res.Lease = backends.Lease{Key: req.Key, Owner: req.Owner, Token: rec.token + 1, Attempt: rec.attempt + 1,
			Takeover: rec.state == statePending}
		if res.Lease.Takeover {
			live = strconv.FormatInt(rec.retention, 10)
		}
		next = leaseRecord(res.Lease.Token, req.Owner, res.Lease.Attempt, retention, ttl, 0, req.Origin, fp)
	}
	n, err := s.calls.run(ctx, takeScript, key, v, next, ttl+retention, live).Int64()
	switch {
	case err != nil:
		return backends.AcquireResult{}, false, opError(ctx, "acquire", err)
	case n == 1:
		return res, true, nil
	case n < 0:
		return backends.AcquireResult{Status: backends.StatusInProgress, Remaining: time.Duration(-n) * time.Millisecond,
			Fingerprint: rec.fingerprint}, true, nil
	}
	return backends.AcquireResult{}, false, nil
}

// completed is the answer for a key completed as rec says.
func completed(rec record) backends.AcquireResult {
	return backends.AcquireResult{Status: backends.StatusCompleted, CompletedAt: rec.completedAt,
		Fingerprint: rec.fingerprint, Output: rec.output}
}

// parseAcquire reads the reply of acquire.lua.
func parseAcquire(req backends.AcquireRequest, vals []any) (backends.AcquireResult, error) {
	bad := func() (backends.AcquireResult, error) {
		return backends.AcquireResult{}, fmt.Errorf("redisstore: acquire: unexpected reply %.200v", vals)
	}
	if len(vals) < 2 {
		return bad()
	}
	outcome, _ := vals[0].(int64)
	v, _ := vals[1].(string)
	rec, err := decodeRecord(v, false)
	if err != nil {
		return bad()
	}
	var n int64
	if len(vals) > 2 {
		n, _ = vals[2].(int64)
	}
	switch outcome {
	case 1:
		lease := rec.lease(req.Key)
		lease.Takeover = n == 1
		return backends.AcquireResult{Status: backends.StatusAcquired, Lease: lease, Reentrant: n == 2,
			Fingerprint: rec.fingerprint}, nil
	case 2:
		return backends.AcquireResult{Status: backends.StatusInProgress, Remaining: time.Duration(n) * time.Millisecond,
			Fingerprint: rec.fingerprint}, nil
	case 3:
		return completed(rec), nil
	}
	return bad()
}

// opError wraps a failed call's error. go-redis reports a context deadline
// reached during a read as a network timeout, sometimes a moment before the
// context itself is done; joining the context's error lets the caller see
// the deadline with errors.Is.
func opError(ctx context.Context, op string, err error) error {
	ctxErr := ctx.Err()
	if d, ok := ctx.Deadline(); ctxErr == nil && ok && !time.Now().Before(d) {
		ctxErr = context.DeadlineExceeded
	}
	if ctxErr != nil && !errors.Is(err, ctxErr) {
		err = errors.Join(err, ctxErr)
	}
	if rejected(err) {
		return fmt.Errorf("redisstore: %s: %w: %w", op, backends.ErrRejected, err)
	}
	return fmt.Errorf("redisstore: %s: %w", op, err)
}

// rejectedPrefixes start the server error replies that retrying the same
// call cannot fix: a key of another type where a record should be, a
// missing ACL permission or authentication, a command the server does not
// know, a script that fails at run time. Replies such as LOADING, BUSY,
// READONLY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN and OOM are transient.
var rejectedPrefixes = []string{
	"WRONGTYPE", "NOPERM", "NOAUTH", "WRONGPASS", "ERR unknown command",
	"ERR user_script", "ERR Error running script",
}

func rejected(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	for _, p := range rejectedPrefixes {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func bytesOrNil(v any) []byte {
	if s, ok := v.(string); ok && s != "" {
		return []byte(s)
	}
	return nil
}

// onLease runs lease.lua on the lease with args, its operation and that
// operation's arguments (see the script), and answers 1 when the lease
// held and 0 when it did not.
func (s *Store) onLease(ctx context.Context, name string, lease backends.Lease, args ...any) error {
	if err := storekit.ValidateLease(lease); err != nil {
		return err
	}
	argv := append(append(make([]any, 0, 4), leaseHeader(lease)), args...)
	n, err := s.calls.run(ctx, leaseScript, s.prefix+lease.Key, argv...).Int64()
	if err != nil {
		return opError(ctx, name, err)
	}
	if n != 1 {
		return backends.ErrLeaseLost
	}
	return nil
}

// Renew implements [backends.Store].
func (s *Store) Renew(ctx context.Context, lease backends.Lease, ttl time.Duration) error {
	if err := storekit.ValidateLeaseTTL(ttl); err != nil {
		return err
	}
	return s.onLease(ctx, "renew", lease, "n", ms(ttl))
}

// Complete implements [backends.Store]. The record keeps the completion
// time by this process's clock.
func (s *Store) Complete(ctx context.Context, lease backends.Lease, output []byte) error {
	return s.onLease(ctx, "complete", lease, "c", completion(time.Now()), output)
}

// Release implements [backends.Store].
func (s *Store) Release(ctx context.Context, lease backends.Lease) error {
	return s.onLease(ctx, "release", lease, "r")
}

// Inspect implements [backends.Store].
func (s *Store) Inspect(ctx context.Context, key string) (backends.Record, error) {
	if err := storekit.ValidateKey(key); err != nil {
		return backends.Record{}, err
	}
	vals, err := s.calls.run(ctx, inspectScript, s.prefix+key).Slice()
	if errors.Is(err, redis.Nil) {
		return backends.Record{}, backends.ErrNotFound
	}
	if err != nil {
		return backends.Record{}, opError(ctx, "inspect", err)
	}
	return parseRecord(key, vals, false)
}

// parseRecord reads the reply of inspect.lua for key: with header, of the
// script run with 'header' (Count's), whose record has its state, fencing
// token, owner, attempt, lease and expiry, and when the lease was
// acquired, but no origin, fingerprint or output.
func parseRecord(key string, vals []any, header bool) (backends.Record, error) {
	bad := func() (backends.Record, error) {
		return backends.Record{}, fmt.Errorf("redisstore: inspect: unexpected reply of %d values", len(vals))
	}
	if len(vals) < 4 {
		return bad()
	}
	layout, _ := vals[0].(int64)
	now, ok := serverTime(vals[1], vals[2])
	if !ok {
		return bad()
	}
	at, _ := vals[3].(int64)
	var expires time.Time
	if at >= 0 {
		expires = time.UnixMilli(at)
	}
	if layout == 1 {
		if len(vals)%2 != 0 {
			return bad()
		}
		f := make(map[string]string, (len(vals)-4)/2)
		for i := 4; i+1 < len(vals); i += 2 {
			k, _ := vals[i].(string)
			v, _ := vals[i+1].(string)
			f[k] = v
		}
		return legacyRecord(key, f, now, expires), nil
	}
	if layout != 2 || len(vals) != 5 {
		return bad()
	}
	v, _ := vals[4].(string)
	rec, err := decodeRecord(v, header)
	if err != nil {
		return backends.Record{}, fmt.Errorf("redisstore: inspect: %w: %w", backends.ErrRejected, err)
	}
	out := backends.Record{
		Key: key, Owner: rec.owner, Token: rec.token, Attempt: rec.attempt,
		Fingerprint: rec.fingerprint, Output: rec.output, ExpiresAt: expires,
		CompletedAt: rec.completedAt, Origin: rec.origin, AcquiredAt: rec.acquiredAt(at),
	}
	out.LeaseExpiresAt, out.State = leaseState(rec, now, at)
	return out, nil
}

// leaseState is when the lease of rec ended or ends, on the server's
// clock, and the record's state, at now, for a key that expires at at (ms
// since the epoch, -1 for never). The key expires one retention after the
// lease (while it is held) or after the release or completion, so that
// moment is the key's expiry less the retention; a completed lease ended
// at the completion, as its record says to the microsecond.
func leaseState(rec record, now time.Time, at int64) (time.Time, backends.State) {
	leaseEnd := time.UnixMilli(at - rec.retention)
	switch {
	case rec.state == stateCompleted:
		return rec.completedAt, backends.StateCompleted
	case rec.state == stateReleased:
		return leaseEnd, backends.StateReleased
	case at < 0 || leaseEnd.After(now):
		return leaseEnd, backends.StateInProgress
	}
	return leaseEnd, backends.StateExpired
}

// serverTime reads the two strings of Redis's TIME.
func serverTime(secs, usecs any) (time.Time, bool) {
	s, _ := secs.(string)
	u, _ := usecs.(string)
	sec, err1 := strconv.ParseInt(s, 10, 64)
	usec, err2 := strconv.ParseInt(u, 10, 64)
	return time.Unix(sec, usec*1000), err1 == nil && err2 == nil
}

// legacyRecord reads the fields f of a record kept as a hash by 0.1.0.
func legacyRecord(key string, f map[string]string, now, expires time.Time) backends.Record {
	num := func(k string) int64 { n, _ := strconv.ParseInt(f[k], 10, 64); return n }
	rec := backends.Record{
		Key:            key,
		Owner:          f["o"],
		Token:          num("t"),
		Attempt:        int(num("a")),
		LeaseExpiresAt: time.UnixMilli(num("le")),
		Fingerprint:    bytesOrNil(f["f"]),
		Output:         bytesOrNil(f["out"]),
		ExpiresAt:      expires,
	}
	rec.State = legacyState(f["s"], rec.LeaseExpiresAt, now)
	switch rec.State {
	case backends.StateCompleted:
		rec.CompletedAt = time.UnixMilli(num("ca"))
		rec.LeaseExpiresAt = rec.CompletedAt
	case backends.StateReleased:
		if !expires.IsZero() { // released, the hash expires one retention after the release
			rec.LeaseExpiresAt = expires.Add(-time.Duration(num("r")) * time.Millisecond)
		}
	}
	return rec
}

// legacyState is the state of a 0.1.0 record whose s field is s and whose
// lease expires at leaseExpires, at now.
func legacyState(s string, leaseExpires, now time.Time) backends.State {
	switch {
	case s == "3":
		return backends.StateCompleted
	case s == "2":
		return backends.StateReleased
	case leaseExpires.After(now):
		return backends.StateInProgress
	}
	return backends.StateExpired
}

// Delete implements [backends.Store].
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := storekit.ValidateKey(key); err != nil {
		return err
	}
	n, err := s.calls.run(ctx, deleteScript, s.prefix+key).Int64()
	if err != nil {
		return opError(ctx, "delete", err)
	}
	if n == 0 {
		return backends.ErrNotFound
	}
	return nil
}
