package backends

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors returned by every store. Callers compare with [errors.Is].
var (
	// ErrLeaseLost means the lease is no longer the caller's: another owner
	// took it over after it expired, it was released or completed, or the
	// record is gone. Nothing was changed.
	ErrLeaseLost = errors.New("backends: lease lost")

	// ErrNotFound is returned by Inspect and Delete when the key has no record.
	ErrNotFound = errors.New("backends: record not found")

	// ErrInvalidRequest is returned for a request no store can serve: an
	// empty key or owner, a non-positive lease TTL, a negative retention.
	ErrInvalidRequest = errors.New("backends: invalid request")
)

// Store is the contract every idempotency store implements. All methods are
// safe for concurrent use. See the package documentation for the rules
// behind each method.
type Store interface {
	// Acquire takes the processing lease on req.Key for req.Owner, or
	// reports why it cannot: the key is held by someone else
	// ([OutcomeInProgress]) or its work is already done ([OutcomeCompleted]).
	// It returns [ErrInvalidRequest] for a malformed request.
	Acquire(ctx context.Context, req AcquireRequest) (AcquireResult, error)

	// Renew extends the lease to ttl from now (the store's now). It returns
	// [ErrLeaseLost] if the lease is no longer held by its owner with its
	// fencing token.
	Renew(ctx context.Context, lease Lease, ttl time.Duration) error

	// Complete marks the lease's key completed, keeps the record for
	// retention, and stores output (which may be nil) with it. It returns
	// [ErrLeaseLost] if the lease is no longer held.
	Complete(ctx context.Context, lease Lease, retention time.Duration, output []byte) error

	// Release gives the lease up so that the next Acquire takes the key at
	// once. The record, and so its fencing token, is kept for the retention
	// given at Acquire. It returns [ErrLeaseLost] if the lease is no longer
	// held, and never removes a lease held by another owner.
	Release(ctx context.Context, lease Lease) error

	// Inspect returns the key's record, or [ErrNotFound].
	Inspect(ctx context.Context, key string) (Record, error)

	// Delete removes the key's record whatever its state, or returns
	// [ErrNotFound]. It is meant for operators: deleting the record of a
	// key in progress lets a duplicate run concurrently with the holder.
	Delete(ctx context.Context, key string) error
}

// AcquireRequest is the input to [Store.Acquire].
type AcquireRequest struct {
	// Key is the full idempotency key (namespace included). Required.
	Key string
	// Owner identifies this attempt; it must be unique per attempt (the
	// middleware uses 128 random bits). Required.
	Owner string
	// LeaseTTL is how long the lease lasts unless renewed. Must be positive.
	LeaseTTL time.Duration
	// Retention is how long the record outlives its lease when the lease
	// is released or runs out, so that the fencing token keeps counting up
	// and an operator can inspect it. Must not be negative.
	Retention time.Duration
	// Fingerprint optionally identifies the payload. The store keeps the
	// first fingerprint it is given for a record and returns it in every
	// result, so the caller can tell a duplicate from a key collision.
	Fingerprint []byte
}

// Validate reports whether the request is well formed, wrapping
// [ErrInvalidRequest] if not. Stores call it before they touch the server.
func (r AcquireRequest) Validate() error {
	switch {
	case r.Key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidRequest)
	case r.Owner == "":
		return fmt.Errorf("%w: empty owner", ErrInvalidRequest)
	case r.LeaseTTL <= 0:
		return fmt.Errorf("%w: lease TTL must be positive, got %v", ErrInvalidRequest, r.LeaseTTL)
	case r.Retention < 0:
		return fmt.Errorf("%w: retention must not be negative, got %v", ErrInvalidRequest, r.Retention)
	}
	return nil
}

// ValidateLease reports whether a lease can be sent to a store, wrapping
// [ErrInvalidRequest] if not.
func ValidateLease(l Lease) error {
	switch {
	case l.Key == "":
		return fmt.Errorf("%w: lease has an empty key", ErrInvalidRequest)
	case l.Owner == "":
		return fmt.Errorf("%w: lease has an empty owner", ErrInvalidRequest)
	}
	return nil
}

// ValidateTTL reports whether a duration passed to Renew (a TTL, which must
// be positive) or Complete (a retention, which may be zero when allowZero)
// is usable, wrapping [ErrInvalidRequest] if not. name is used in the message.
func ValidateTTL(name string, d time.Duration, allowZero bool) error {
	if d < 0 || (d == 0 && !allowZero) {
		return fmt.Errorf("%w: %s out of range: %v", ErrInvalidRequest, name, d)
	}
	return nil
}

// Outcome is what Acquire decided.
type Outcome int

const (
	// OutcomeAcquired: the caller holds the lease and should do the work.
	OutcomeAcquired Outcome = iota + 1
	// OutcomeInProgress: another owner holds a live lease.
	OutcomeInProgress
	// OutcomeCompleted: the work is done; the result carries its output.
	OutcomeCompleted
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case OutcomeAcquired:
		return "acquired"
	case OutcomeInProgress:
		return "in_progress"
	case OutcomeCompleted:
		return "completed"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Lease is a held processing lease. It is a value: keep it and pass it back
// to Renew, Complete and Release.
type Lease struct {
	// Key is the record's key.
	Key string
	// Owner is the owner token the lease was acquired with.
	Owner string
	// Token is the fencing token: strictly increasing per key. Pass it to
	// the systems the handler writes to so they can reject a stale holder.
	Token int64
	// Attempt counts the acquisitions of this key, this one included.
	Attempt int
	// Takeover is true when this acquisition took over an expired lease of
	// another owner (the previous holder stopped renewing).
	Takeover bool
	// Reentrant is true when the owner already held this lease and got it
	// back (a retried Acquire after an ambiguous failure).
	Reentrant bool
}

// AcquireResult is the answer to [Store.Acquire]. Which fields are set
// depends on Outcome.
type AcquireResult struct {
	Outcome Outcome
	// Lease is set for OutcomeAcquired.
	Lease Lease
	// Remaining is the time left on the holder's lease, by the store's
	// clock, for OutcomeInProgress.
	Remaining time.Duration
	// CompletedAt is when the work was completed, by the store's clock, for
	// OutcomeCompleted.
	CompletedAt time.Time
	// Output is the output stored by Complete, for OutcomeCompleted.
	Output []byte
	// Fingerprint is the fingerprint the record was first acquired with,
	// for every outcome (nil if none was given).
	Fingerprint []byte
}

// State is the state of a record, as reported by Inspect.
type State int

const (
	// StateInProgress: a lease is held and has not expired.
	StateInProgress State = iota + 1
	// StateExpired: a lease was held and has expired without being renewed,
	// released or taken over. The next Acquire takes it over.
	StateExpired
	// StateReleased: the lease was released after a failure; the next
	// Acquire takes the key.
	StateReleased
	// StateCompleted: the work is done and the record is kept until its
	// retention ends.
	StateCompleted
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case StateInProgress:
		return "in_progress"
	case StateExpired:
		return "expired"
	case StateReleased:
		return "released"
	case StateCompleted:
		return "completed"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Record is a key's record as reported by Inspect. Times are the store's.
type Record struct {
	Key   string
	State State
	// Owner is the owner of the current or last lease.
	Owner string
	// Token is the fencing token of the current or last lease.
	Token int64
	// Attempt counts the acquisitions so far.
	Attempt int
	// LeaseExpiresAt is when the current or last lease expires or expired.
	LeaseExpiresAt time.Time
	// CompletedAt is set for StateCompleted.
	CompletedAt time.Time
	// ExpiresAt is when the record itself will be forgotten.
	ExpiresAt   time.Time
	Fingerprint []byte
	Output      []byte
}
