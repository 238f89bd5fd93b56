package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
	//go:embed acquire.lua
	acquireSrc string
	//go:embed renew.lua
	renewSrc string
	//go:embed complete.lua
	completeSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed inspect.lua
	inspectSrc string
	//go:embed delete.lua
	deleteSrc string

	acquireScript  = redis.NewScript(acquireSrc)
	renewScript    = redis.NewScript(renewSrc)
	completeScript = redis.NewScript(completeSrc)
	releaseScript  = redis.NewScript(releaseSrc)
	inspectScript  = redis.NewScript(inspectSrc)
	deleteScript   = redis.NewScript(deleteSrc)
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
	// CoalesceConcurrent sends the calls that arrive while every round
	// trip the store keeps in flight is busy together, in one pipeline,
	// as soon as one of those ends. The default.
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

func (s *Store) redisKey(key string) []string { return []string{s.prefix + key} }

// ms converts d to whole milliseconds, rounding up: Redis keeps time in
// milliseconds, and a lease must never be shorter than asked for.
func ms(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// Acquire implements [backends.Store].
func (s *Store) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	if err := storekit.ValidateAcquire(req); err != nil {
		return backends.AcquireResult{}, err
	}
	vals, err := s.calls.run(ctx, acquireScript, s.redisKey(req.Key),
		req.Owner, ms(req.LeaseTTL), ms(req.Retention), req.Fingerprint).Slice()
	if err != nil {
		return backends.AcquireResult{}, opError(ctx, "acquire", err)
	}
	return parseAcquire(req, vals)
}

func parseAcquire(req backends.AcquireRequest, vals []any) (backends.AcquireResult, error) {
	bad := func() (backends.AcquireResult, error) {
		return backends.AcquireResult{}, fmt.Errorf("redisstore: acquire: unexpected reply %v", vals)
	}
	if len(vals) < 3 {
		return bad()
	}
	outcome, _ := vals[0].(int64)
	var res backends.AcquireResult
	switch outcome {
	case 1:
		if len(vals) != 5 {
			return bad()
		}
		token, _ := vals[1].(int64)
		attempt, _ := vals[2].(int64)
		flags, _ := vals[3].(int64)
		res.Status = backends.Acquired
		res.Lease = backends.Lease{Key: req.Key, Owner: req.Owner, Token: token, Attempt: int(attempt), Takeover: flags == 1}
		res.Reentrant = flags == 2
		res.Fingerprint = bytesOrNil(vals[4])
	case 2:
		remaining, _ := vals[1].(int64)
		res.Status = backends.InProgress
		res.Remaining = time.Duration(remaining) * time.Millisecond
		res.Fingerprint = bytesOrNil(vals[2])
	case 3:
		if len(vals) != 4 {
			return bad()
		}
		at, _ := vals[1].(int64)
		res.Status = backends.Completed
		res.CompletedAt = time.UnixMilli(at)
		res.Fingerprint = bytesOrNil(vals[2])
		res.Output = bytesOrNil(vals[3])
	default:
		return bad()
	}
	return res, nil
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

// checked runs a script that answers 1 when the lease held and 0 when it
// did not.
func (s *Store) checked(ctx context.Context, op string, script *redis.Script, lease backends.Lease, args ...any) error {
	if err := storekit.ValidateLease(lease); err != nil {
		return err
	}
	args = append([]any{lease.Owner, lease.Token}, args...)
	n, err := s.calls.run(ctx, script, s.redisKey(lease.Key), args...).Int64()
	if err != nil {
		return opError(ctx, op, err)
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
	return s.checked(ctx, "renew", renewScript, lease, ms(ttl))
}

// Complete implements [backends.Store].
func (s *Store) Complete(ctx context.Context, lease backends.Lease, output []byte) error {
	return s.checked(ctx, "complete", completeScript, lease, output)
}

// Release implements [backends.Store].
func (s *Store) Release(ctx context.Context, lease backends.Lease) error {
	return s.checked(ctx, "release", releaseScript, lease)
}

// Inspect implements [backends.Store].
func (s *Store) Inspect(ctx context.Context, key string) (backends.Record, error) {
	if err := storekit.ValidateKey(key); err != nil {
		return backends.Record{}, err
	}
	vals, err := s.calls.run(ctx, inspectScript, s.redisKey(key)).Slice()
	if errors.Is(err, redis.Nil) {
		return backends.Record{}, backends.ErrNotFound
	}
	if err != nil {
		return backends.Record{}, opError(ctx, "inspect", err)
	}
	return parseRecord(key, vals)
}

// parseRecord reads the reply of inspect.lua for key.
func parseRecord(key string, vals []any) (backends.Record, error) {
	if len(vals) < 2 || len(vals)%2 != 0 {
		return backends.Record{}, fmt.Errorf("redisstore: inspect: unexpected reply of %d values", len(vals))
	}
	nowMs, _ := vals[0].(int64)
	pttl, _ := vals[1].(int64)
	now := time.UnixMilli(nowMs)
	f := make(map[string]string, (len(vals)-2)/2)
	for i := 2; i+1 < len(vals); i += 2 {
		k, _ := vals[i].(string)
		v, _ := vals[i+1].(string)
		f[k] = v
	}
	num := func(k string) int64 { n, _ := strconv.ParseInt(f[k], 10, 64); return n }
	rec := backends.Record{
		Key:            key,
		Owner:          f["o"],
		Token:          num("t"),
		Attempt:        int(num("a")),
		LeaseExpiresAt: time.UnixMilli(num("le")),
		Fingerprint:    bytesOrNil(f["f"]),
		Output:         bytesOrNil(f["out"]),
	}
	if pttl >= 0 {
		rec.ExpiresAt = now.Add(time.Duration(pttl) * time.Millisecond)
	}
	rec.State = state(f["s"], rec.LeaseExpiresAt, now)
	if rec.State == backends.StateCompleted {
		rec.CompletedAt = time.UnixMilli(num("ca"))
	}
	return rec, nil
}

// state is the state of a record whose s field is s and whose lease
// expires at leaseExpires, at now.
func state(s string, leaseExpires, now time.Time) backends.State {
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
	n, err := s.calls.run(ctx, deleteScript, s.redisKey(key)).Int64()
	if err != nil {
		return opError(ctx, "delete", err)
	}
	if n == 0 {
		return backends.ErrNotFound
	}
	return nil
}
