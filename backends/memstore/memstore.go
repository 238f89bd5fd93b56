package memstore

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

var (
	_ backends.Store  = (*Store)(nil)
	_ backends.Lister = (*Store)(nil)
)

// Options configures a [Store]. The zero value is ready to use.
type Options struct {
	// Now returns the store's current time. Defaults to [time.Now].
	Now func() time.Time
	// PruneInterval is the least time between two sweeps that remove
	// records past their retention; zero means the default. Defaults to
	// one minute.
	PruneInterval time.Duration
}

// Store is an in-memory [backends.Store]. Create it with [New].
type Store struct {
	opts          Options
	now           func() time.Time
	pruneInterval time.Duration

	mu        sync.Mutex
	records   map[string]*record
	lastPrune time.Time
	// wakes are the watches of keys; a key's are woken under mu.
	wakes storekit.Wakes
}

type state uint8

const (
	stateLeased state = iota + 1
	stateReleased
	stateCompleted
)

type record struct {
	state        state
	owner        string
	token        int64
	attempt      int
	acquiredAt   time.Time
	leaseExpires time.Time
	retention    time.Duration
	completedAt  time.Time
	forgetAt     time.Time
	fingerprint  []byte
	output       []byte
	origin       string
}

// New returns an empty store. It returns an error wrapping
// [backends.ErrInvalidOptions] for a negative PruneInterval.
func New(opts Options) (*Store, error) {
	if opts.PruneInterval < 0 {
		return nil, fmt.Errorf("memstore: %w: negative PruneInterval %v", backends.ErrInvalidOptions, opts.PruneInterval)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.PruneInterval == 0 {
		opts.PruneInterval = time.Minute
	}
	return &Store{
		opts:          opts,
		now:           opts.Now,
		pruneInterval: opts.PruneInterval,
		records:       make(map[string]*record),
		lastPrune:     opts.Now(),
	}, nil
}

// Options returns the store's options with defaults applied.
func (s *Store) Options() Options { return s.opts }

// live returns the key's record unless it is absent or past its retention.
// The caller holds s.mu.
func (s *Store) live(key string, now time.Time) *record {
	r := s.records[key]
	if r == nil {
		return nil
	}
	if !now.Before(r.forgetAt) {
		delete(s.records, key)
		return nil
	}
	return r
}

// pruneLocked removes every record past its retention, at most once per
// prune interval. The caller holds s.mu.
func (s *Store) pruneLocked(now time.Time) {
	if now.Sub(s.lastPrune) < s.pruneInterval {
		return
	}
	s.lastPrune = now
	for k, r := range s.records {
		if !now.Before(r.forgetAt) {
			delete(s.records, k)
		}
	}
}

// Acquire implements [backends.Store].
func (s *Store) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	if err := storekit.ValidateAcquire(req); err != nil {
		return backends.AcquireResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return backends.AcquireResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.pruneLocked(now)

	r := s.live(req.Key, now)
	if r == nil {
		r = &record{fingerprint: bytes.Clone(req.Fingerprint)}
		s.records[req.Key] = r
	}
	if r.fingerprint == nil && req.Fingerprint != nil {
		r.fingerprint = bytes.Clone(req.Fingerprint)
	}
	res := backends.AcquireResult{Fingerprint: bytes.Clone(r.fingerprint)}

	var reentrant, takeover bool
	switch {
	case r.state == stateCompleted:
		res.Status = backends.StatusCompleted
		res.CompletedAt = r.completedAt
		res.Output = bytes.Clone(r.output)
		return res, nil
	case r.state == stateLeased && r.owner == req.Owner:
		reentrant = true
	case r.state == stateLeased && now.Before(r.leaseExpires):
		res.Status = backends.StatusInProgress
		res.Remaining = r.leaseExpires.Sub(now)
		return res, nil
	case r.state == stateLeased:
		takeover = true
	}
	if !reentrant {
		r.token++
		r.attempt++
		r.owner = req.Owner
		r.origin = req.Origin
		r.acquiredAt = now
	}
	r.state = stateLeased
	r.retention = req.Retention
	r.leaseExpires = now.Add(req.LeaseTTL)
	r.forgetAt = r.leaseExpires.Add(r.retention)

	res.Status = backends.StatusAcquired
	res.Reentrant = reentrant
	res.Lease = backends.Lease{
		Key:      req.Key,
		Owner:    r.owner,
		Token:    r.token,
		Attempt:  r.attempt,
		Takeover: takeover,
	}
	return res, nil
}

// update runs fn on the lease's record if the lease still holds it, under
// the store's lock; otherwise it returns ErrLeaseLost. durErr is the
// caller's validation of its duration argument, if it has one.
func (s *Store) update(ctx context.Context, l backends.Lease, durErr error, fn func(r *record, now time.Time)) error {
	if err := storekit.ValidateLease(l); err != nil {
		return err
	}
	if durErr != nil {
		return durErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r := s.live(l.Key, now)
	if r == nil || r.state != stateLeased || r.owner != l.Owner || r.token != l.Token {
		return backends.ErrLeaseLost
	}
	fn(r, now)
	if r.state != stateLeased {
		s.wakes.Wake(l.Key) // completed or released: the waiters may go on
	}
	return nil
}

// Renew implements [backends.Store].
func (s *Store) Renew(ctx context.Context, lease backends.Lease, ttl time.Duration) error {
	return s.update(ctx, lease, storekit.ValidateLeaseTTL(ttl), func(r *record, now time.Time) {
		r.leaseExpires = now.Add(ttl)
		r.forgetAt = r.leaseExpires.Add(r.retention)
	})
}

// Complete implements [backends.Store].
func (s *Store) Complete(ctx context.Context, lease backends.Lease, output []byte) error {
	return s.update(ctx, lease, nil, func(r *record, now time.Time) {
		r.state = stateCompleted
		r.completedAt = now
		r.forgetAt = now.Add(r.retention)
		r.output = bytes.Clone(output)
	})
}

// Release implements [backends.Store].
func (s *Store) Release(ctx context.Context, lease backends.Lease) error {
	return s.update(ctx, lease, nil, func(r *record, now time.Time) {
		r.state = stateReleased
		r.leaseExpires = now // the lease ended with the release
		r.forgetAt = now.Add(r.retention)
	})
}

// Inspect implements [backends.Store].
func (s *Store) Inspect(ctx context.Context, key string) (backends.Record, error) {
	if err := storekit.ValidateKey(key); err != nil {
		return backends.Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return backends.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r := s.live(key, now)
	if r == nil {
		return backends.Record{}, backends.ErrNotFound
	}
	return r.export(key, now), nil
}

// export returns the record as Inspect reports it at now.
func (r *record) export(key string, now time.Time) backends.Record {
	rec := backends.Record{
		Key:            key,
		Owner:          r.owner,
		Token:          r.token,
		Attempt:        r.attempt,
		LeaseExpiresAt: r.leaseExpires,
		CompletedAt:    r.completedAt,
		ExpiresAt:      r.forgetAt,
		Fingerprint:    bytes.Clone(r.fingerprint),
		Output:         bytes.Clone(r.output),
		Origin:         r.origin,
		AcquiredAt:     r.acquiredAt,
	}
	switch {
	case r.state == stateCompleted:
		rec.State = backends.StateCompleted
		rec.LeaseExpiresAt = r.completedAt
	case r.state == stateReleased:
		rec.State = backends.StateReleased
	case now.Before(r.leaseExpires):
		rec.State = backends.StateInProgress
	default:
		rec.State = backends.StateExpired
	}
	return rec
}

// Delete implements [backends.Store].
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := storekit.ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live(key, s.now()) == nil {
		return backends.ErrNotFound
	}
	delete(s.records, key)
	s.wakes.Wake(key)
	return nil
}

// List implements [backends.Lister]. It sorts the namespace's keys on
// every call: meant for operators and tests, not for large stores.
func (s *Store) List(ctx context.Context, req backends.ListRequest) (backends.ListPage, error) {
	if err := storekit.ValidateList(req); err != nil {
		return backends.ListPage{}, err
	}
	if err := ctx.Err(); err != nil {
		return backends.ListPage{}, err
	}
	prefix := storekit.ListPrefix(req.Namespace)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	keys := make([]string, 0)
	for k, r := range s.records {
		if strings.HasPrefix(k, prefix) && now.Before(r.forgetAt) {
			keys = append(keys, k)
		}
	}
	return storekit.Page(ctx, req, keys, 0, func(_ context.Context, keys []string) ([]backends.Record, error) {
		recs := make([]backends.Record, len(keys))
		for i, k := range keys {
			recs[i] = s.records[k].export(k, now)
		}
		return recs, nil
	})
}

// Count implements [backends.Lister].
func (s *Store) Count(ctx context.Context, namespace string) (backends.Counts, error) {
	if err := ctx.Err(); err != nil {
		return backends.Counts{}, err
	}
	prefix := storekit.ListPrefix(namespace)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var c backends.Counts
	for k, r := range s.records {
		if strings.HasPrefix(k, prefix) && now.Before(r.forgetAt) {
			rec := r.export(k, now)
			storekit.AddCount(&c, rec.State, rec.AcquiredAt)
		}
	}
	return c, nil
}

var _ backends.Watcher = (*Store)(nil)

// Watch implements [backends.Watcher]: Complete, Release and Delete wake
// the key's watches at once. It is always ok: a watch is in place as soon
// as it is registered, and it is woken at once if key holds no live lease
// in progress then.
func (s *Store) Watch(_ context.Context, key string) (<-chan struct{}, func(), bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.wakes.Add(key)
	if r := s.records[key]; r == nil || r.export(key, s.now()).State != backends.StateInProgress {
		w.Wake()
	}
	return w.Changed(), w.Stop, true
}
