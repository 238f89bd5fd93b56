package backends

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Limits every store accepts, and the largest values it must accept. A
// request beyond them is refused with [ErrInvalidRequest] before it reaches
// the server, by every store alike (package storekit has the checks).
const (
	// MaxKeyBytes is the longest key, in bytes, a store must accept. It
	// fits a Postgres B-tree index entry (about 2.7 KB) and a DynamoDB
	// partition key (2 KB). Hash longer keys (keyfunc.Hashed).
	MaxKeyBytes = 2048
	// MaxFingerprintBytes is the longest fingerprint Acquire accepts, kept
	// and returned whole by every store (a SHA-256 is 32 bytes). The
	// middleware hashes a longer one to 32 bytes before it asks.
	MaxFingerprintBytes = 4 << 10
	// MaxOwnerBytes is the longest owner token. An owner is 1 to
	// MaxOwnerBytes bytes of valid UTF-8 without NUL, so that every store
	// can keep it as text.
	MaxOwnerBytes = 255
	// MaxOriginBytes is the longest origin (AcquireRequest.Origin): 0 to
	// MaxOriginBytes bytes of valid UTF-8 without NUL, kept as text.
	MaxOriginBytes = 255
	// MaxDuration is the longest lease TTL or retention. Stores keep time
	// in milliseconds or microseconds after their server's now; the bound
	// keeps every expiry far from overflowing any of them.
	MaxDuration = 100 * 365 * 24 * time.Hour
)

// Sentinel errors returned by every store. Callers compare with [errors.Is].
var (
	// ErrLeaseLost means the lease is no longer the caller's: another owner
	// took it over after it expired, it was released or completed, or the
	// record is gone. Nothing was changed. The middleware wraps it too in
	// the error of a delivery whose lease was lost while its handler ran
	// (or could not be renewed before it would expire), and in the cause
	// it cancels the handler's context with.
	ErrLeaseLost = errors.New("backends: lease lost")

	// ErrNotFound is returned by Inspect and Delete when the key has no record.
	ErrNotFound = errors.New("backends: record not found")

	// ErrInvalidRequest is returned for a request no store can serve: an
	// empty or oversize key, an invalid owner, a lease TTL or retention out
	// of range. Nothing was sent to the server.
	ErrInvalidRequest = errors.New("backends: invalid request")

	// ErrRejected is wrapped by errors a store's server returned for a
	// call that retrying cannot fix: a missing table, a missing
	// permission, a value the server cannot hold. Stores translate such
	// server errors at their boundary; the middleware fails the delivery
	// at once instead of retrying the call until its timeout. Any other
	// error is taken as transient.
	ErrRejected = errors.New("backends: rejected by the store")
)

// Errors returned by the constructors of every store. A store wraps them
// with its name and what it refused ("pgstore: backends: invalid options:
// ..."); callers compare with [errors.Is].
var (
	// ErrNilClient: the constructor was given no client (or database, or
	// pool), or a typed nil one. No store panics on it.
	ErrNilClient = errors.New("backends: nil client")

	// ErrInvalidOptions: the constructor was given options out of range,
	// or a client it cannot serve every capability with.
	ErrInvalidOptions = errors.New("backends: invalid options")
)

// IsPermanent reports whether a store error is one retrying cannot fix:
// it wraps [ErrInvalidRequest] or [ErrRejected]. A caller that retries
// store calls, as the middleware does, gives up at once on such an error.
func IsPermanent(err error) bool {
	return errors.Is(err, ErrInvalidRequest) || errors.Is(err, ErrRejected)
}

// Store is the contract every idempotency store implements. All methods are
// safe for concurrent use. See the package documentation for the rules
// behind each method.
type Store interface {
	// Acquire takes the processing lease on req.Key for req.Owner, or
	// reports why it cannot: the key is held by someone else
	// ([StatusInProgress]) or its work is already done ([StatusCompleted]). It returns
	// [ErrInvalidRequest] for a malformed request.
	Acquire(ctx context.Context, req AcquireRequest) (AcquireResult, error)

	// Renew extends the lease to ttl from now (the store's now). It returns
	// [ErrLeaseLost] if the lease is no longer held by its owner with its
	// fencing token.
	Renew(ctx context.Context, lease Lease, ttl time.Duration) error

	// Complete marks the lease's key completed and stores output (which
	// may be nil, and is encoded with [EncodeOutput] by the middleware)
	// with it. The record is kept for the retention given at Acquire,
	// counted from now. It returns [ErrLeaseLost] if the lease is no
	// longer held.
	Complete(ctx context.Context, lease Lease, output []byte) error

	// Release gives the lease up so that the next Acquire takes the key at
	// once. The record, and so its fencing token, is kept for the retention
	// given at Acquire. It returns [ErrLeaseLost] if the lease is no longer
	// held, and never removes a lease held by another owner.
	Release(ctx context.Context, lease Lease) error

	// Inspect returns the key's record, or [ErrNotFound]. A key beyond the
	// limits ([MaxKeyBytes]) is an invalid request.
	Inspect(ctx context.Context, key string) (Record, error)

	// Delete removes the key's record whatever its state, or returns
	// [ErrNotFound]; a key beyond the limits is an invalid request. It is
	// meant for operators: deleting the record of a key in progress lets a
	// duplicate run concurrently with the holder.
	Delete(ctx context.Context, key string) error
}

// PoolSizer is an optional capability of a [Store]: how many calls its
// client can have in flight at once, usually the size of its connection
// pool. The middleware, by default, lets new acquisitions take at most
// half of them, so that renewing and completing the leases of running
// handlers always finds a connection.
type PoolSizer interface {
	// PoolSize returns the number of concurrent calls, or 0 if unknown.
	PoolSize() int
}

// OutputLimiter is an optional capability of a [Store]: the largest
// output Complete accepts, for a store whose server caps the size of a
// record (DynamoDB's items are at most 400 KB). The middleware lowers its
// default MaxOutputBytes to it and refuses a configuration above it, so
// that an output too large is the middleware's typed error, not a failed
// completion. Complete refuses a longer output with an error wrapping
// [ErrInvalidRequest] and changes nothing.
type OutputLimiter interface {
	// MaxOutputBytes returns the longest output in bytes, or 0 if the
	// store sets no limit of its own.
	MaxOutputBytes() int
}

// AcquireRequest is the input to [Store.Acquire].
type AcquireRequest struct {
	// Key is the full idempotency key (namespace included): 1 to
	// [MaxKeyBytes] arbitrary bytes. Required.
	Key string
	// Owner identifies this attempt; it must be unique per attempt (the
	// middleware uses a random per-process prefix and a counter): 1 to
	// [MaxOwnerBytes] bytes of valid UTF-8 without NUL. Required.
	Owner string
	// LeaseTTL is how long the lease lasts unless renewed: positive and at
	// most [MaxDuration].
	LeaseTTL time.Duration
	// Retention is how long the record is kept once it is completed, and
	// how long it outlives its lease when the lease is released or runs
	// out (so that the fencing token keeps counting up and an operator can
	// inspect it): zero to [MaxDuration]. The store keeps it with the
	// record; Complete and Release use it.
	Retention time.Duration
	// Fingerprint optionally identifies the payload: at most
	// [MaxFingerprintBytes] bytes. The store keeps the first fingerprint it
	// is given for a record and returns it whole in every result, so the
	// caller can tell a duplicate from a key collision.
	Fingerprint []byte
	// Origin optionally names, for operators, what asks for the lease:
	// at most [MaxOriginBytes] bytes of valid UTF-8 without NUL. When
	// this call acquires the lease, the store keeps it with the record
	// (replacing the last holder's) until the next acquisition, so that
	// [Record.Origin] tells who holds a key in progress, or which
	// delivery completed it. A re-entrant Acquire keeps the origin it
	// first gave. The middleware sets it to the message's UUID and the
	// handler's name: "message_uuid=<uuid> handler=<name>".
	Origin string
}

// Status is what Acquire decided.
type Status int

const (
	// StatusAcquired: the caller holds the lease and should do the work.
	StatusAcquired Status = iota + 1
	// StatusInProgress: another owner holds a live lease.
	StatusInProgress
	// StatusCompleted: the work is done; the result carries its output.
	StatusCompleted
)

// The Status constants' names before they took the prefix [State]'s
// constants have. They go in a later release.
const (
	// Deprecated: use StatusAcquired.
	Acquired = StatusAcquired
	// Deprecated: use StatusInProgress.
	InProgress = StatusInProgress
	// Deprecated: use StatusCompleted.
	Completed = StatusCompleted
)

// String returns the status's name.
func (s Status) String() string {
	switch s {
	case StatusAcquired:
		return "acquired"
	case StatusInProgress:
		return "in_progress"
	case StatusCompleted:
		return "completed"
	}
	return fmt.Sprintf("Status(%d)", int(s))
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
}

// AcquireResult is the answer to [Store.Acquire]. Which fields are set
// depends on Status.
type AcquireResult struct {
	// Status is what Acquire decided.
	Status Status
	// Lease is set for Acquired.
	Lease Lease
	// Reentrant is set for Acquired when the owner already held the lease
	// and got it back, the same fencing token with its expiry extended: a
	// retried Acquire after an ambiguous failure. The conformance suite
	// checks that stores report it; for callers it is informational.
	Reentrant bool
	// Remaining is the time left on the holder's lease, by the store's
	// clock, for InProgress.
	Remaining time.Duration
	// CompletedAt is when the work was completed, for Completed: by the
	// store's clock, or, where the store keeps no time of its own for it
	// (DynamoDB, Redis), by the clock of the process that completed it.
	CompletedAt time.Time
	// Output is the output stored by Complete, for Completed
	// ([DecodeOutput] reads it).
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
	// Key is the record's key.
	Key string
	// State is the record's state, by the store's clock.
	State State
	// Owner is the owner of the current or last lease.
	Owner string
	// Token is the fencing token of the current or last lease.
	Token int64
	// Attempt counts the acquisitions so far.
	Attempt int
	// AcquiredAt is when the current or last lease was acquired; a
	// re-entrant Acquire and a renewal keep it. With Origin, it tells how
	// long a key in progress has been held, and by whom.
	AcquiredAt time.Time
	// LeaseExpiresAt is when the current or last lease expires or
	// expired, or when it ended early: for StateCompleted it is
	// CompletedAt, and for StateReleased when it was released. So every
	// store gives the same answer, and ExpiresAt is one retention after
	// it for a released record.
	LeaseExpiresAt time.Time
	// CompletedAt is set for StateCompleted, by the clock
	// AcquireResult.CompletedAt names.
	CompletedAt time.Time
	// ExpiresAt is when the record itself will be forgotten.
	ExpiresAt time.Time
	// Fingerprint is the payload fingerprint the record was first acquired
	// with, if any.
	Fingerprint []byte
	// Output is the output stored with the completion, if any
	// ([DecodeOutput] reads it).
	Output []byte
	// Origin is the AcquireRequest.Origin of the current or last lease:
	// for StateCompleted, what completed the key. Empty if none was given.
	Origin string
}
