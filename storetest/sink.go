package storetest

import (
	"errors"
	"fmt"
	"sync"

	"github.com/watermill-idempotency/idempotency/backends"
)

// ErrStale is returned by [Sink.Apply] for a write from a holder whose
// fencing token is lower than one the sink has already applied for the key.
var ErrStale = errors.New("storetest: stale fencing token refused")

// Tally is what happened to one key's effect.
type Tally struct {
	// Applied counts the writes the sink accepted: 1 is the promise.
	Applied int
	// Holders counts the distinct leases (fencing tokens) whose handler
	// reached the write: what an unfenced sink would have applied.
	Holders int
}

// Effects is where a storm's handlers apply their effects, as the checks
// read them.
type Effects interface {
	// Applied reports whether an effect was applied for key.
	Applied(key string) (bool, error)
	// Tally returns every key's tally and how many stale writes were
	// refused.
	Tally() (map[string]Tally, int64, error)
}

// Sink is an in-memory fenced sink, as a business system that checks
// fencing tokens would be: per key, it refuses a write whose token is lower
// than the highest it has applied, and treats a write with that same token
// from the same owner as the same write again (a retry within one lease).
type Sink struct {
	mu      sync.Mutex
	keys    map[string]*sinkKey
	refused int64
}

type sinkKey struct {
	highest int64
	owner   string
	applied int
	holders map[int64]struct{}
}

var _ Effects = (*Sink)(nil)

// NewSink returns an empty sink.
func NewSink() *Sink { return &Sink{keys: map[string]*sinkKey{}} }

// Apply applies the effect of lease.Key under lease.
func (s *Sink) Apply(lease backends.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[lease.Key]
	if k == nil {
		k = &sinkKey{holders: map[int64]struct{}{}}
		s.keys[lease.Key] = k
	}
	k.holders[lease.Token] = struct{}{}
	switch {
	case lease.Token < k.highest:
		s.refused++
		return fmt.Errorf("%w: key %q token %d, applied %d", ErrStale, lease.Key, lease.Token, k.highest)
	case lease.Token == k.highest && lease.Owner == k.owner:
		return nil
	}
	// A higher token, or (a broken store) the same token for another owner.
	k.highest, k.owner = lease.Token, lease.Owner
	k.applied++
	return nil
}

// Applied implements [Effects].
func (s *Sink) Applied(key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[key]
	return k != nil && k.applied > 0, nil
}

// Tally implements [Effects].
func (s *Sink) Tally() (map[string]Tally, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Tally, len(s.keys))
	for key, k := range s.keys {
		out[key] = Tally{Applied: k.applied, Holders: len(k.holders)}
	}
	return out, s.refused, nil
}
