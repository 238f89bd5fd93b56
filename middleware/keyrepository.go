package middleware

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// KeyRepository is Watermill's middleware.ExpiringKeyRepository on any
// store of this library, for the Deduplicator: it lets several instances
// share what they saw (Redis, Postgres, MySQL, DynamoDB) with no other
// change to a service that uses the Deduplicator, as a first step.
//
// It keeps the Deduplicator's semantics, and their limits: a key counts as
// seen from the moment it is first checked, before its handler runs, so a
// handler's failure is not retried (the redelivery is dropped as a
// duplicate) and a copy that arrives while the first still runs is acked
// at once. The middleware of this package ([New]) has neither flaw; switch
// to it when you can (docs/migrating-from-deduplicator.md).
type KeyRepository struct {
	store  backends.Store
	window time.Duration
}

// NewKeyRepository returns a repository that remembers each key for
// window in store. The keys are the Deduplicator's, as they are: set a
// prefix in the store's options to keep them apart from other records.
func NewKeyRepository(store backends.Store, window time.Duration) (*KeyRepository, error) {
	if isNil(store) {
		return nil, fmt.Errorf("%w: KeyRepository: nil store", ErrInvalidConfig)
	}
	if window <= 0 || window > backends.MaxDuration {
		return nil, fmt.Errorf("%w: KeyRepository: window must be positive and at most %v, got %v", ErrInvalidConfig, backends.MaxDuration, window)
	}
	return &KeyRepository{store: store, window: window}, nil
}

// IsDuplicate reports whether key was checked within the window before,
// and records it if not: one Acquire, and a Complete for a new key.
func (r *KeyRepository) IsDuplicate(ctx context.Context, key string) (bool, error) {
	// An owner of its own per call: two checks of one key at once, even in
	// one process, find one of them new.
	res, err := r.store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: newOwner(), LeaseTTL: r.window, Retention: r.window})
	if err != nil {
		return false, err
	}
	if res.Status != backends.StatusAcquired {
		return true, nil // completed, or being recorded by another check right now
	}
	if err := r.store.Complete(ctx, res.Lease, nil); err != nil {
		return false, err
	}
	return false, nil
}
