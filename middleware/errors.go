package middleware

import (
	"errors"
	"fmt"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Errors the middleware returns from the handler (so the router nacks the
// message). Compare with [errors.Is]. A lease lost while the handler ran
// (taken over, deleted, or not renewable before it would expire) is an
// error wrapping backends.ErrLeaseLost: the handler's context is cancelled
// with it as the cause and the message is nacked.
var (
	// ErrInvalidKey is wrapped by every [*KeyError].
	ErrInvalidKey = errors.New("idempotency: invalid key")
	// ErrKeyTooLong: the full key is longer than Config.MaxKeyBytes.
	ErrKeyTooLong = errors.New("idempotency: key too long")
	// ErrNoNamespace: no Config.Namespace and no handler name in the
	// message context (the middleware was used outside a router).
	ErrNoNamespace = errors.New("idempotency: no namespace")
	// ErrInProgress: the key is in progress, that is, held by the live
	// lease of another delivery. Matched by every [*InProgressError].
	ErrInProgress = errors.New("idempotency: in progress elsewhere")
	// ErrStore wraps an error from the store.
	ErrStore = errors.New("idempotency: store error")
	// ErrFingerprintMismatch: the key's record was made for a different
	// payload.
	ErrFingerprintMismatch = errors.New("idempotency: fingerprint mismatch")
	// ErrOutputTooLarge: the handler's produced messages do not fit in
	// Config.MaxOutputBytes. The lease was released.
	ErrOutputTooLarge = errors.New("idempotency: output too large")
)

// KeyError is returned for a message without a usable idempotency key. It
// matches [ErrInvalidKey] and the cause (a keyfunc error, [ErrKeyTooLong]
// or [ErrNoNamespace]) under [errors.Is].
type KeyError struct {
	// MessageUUID is the UUID of the message without a usable key.
	MessageUUID string
	// Err is the cause: the extractor's error, [ErrKeyTooLong] or
	// [ErrNoNamespace].
	Err error
}

// Error implements error.
func (e *KeyError) Error() string {
	return fmt.Sprintf("idempotency: no usable key for message %s: %v", e.MessageUUID, e.Err)
}

// Unwrap returns [ErrInvalidKey] and the cause.
func (e *KeyError) Unwrap() []error { return []error{ErrInvalidKey, e.Err} }

// IsPoison reports whether err means the message can never succeed as it
// was sent, however often it is redelivered: no usable key
// ([*KeyError], matching [ErrInvalidKey]), a fingerprint mismatch
// ([ErrFingerprintMismatch]), an output too large to store
// ([ErrOutputTooLarge]), a corrupt stored output
// (backends.ErrCorruptOutput). Use it as the filter of Watermill's
// PoisonQueueWithFilter, outside this middleware, to move such messages
// out of the way:
//
//	poison, err := middleware.PoisonQueueWithFilter(pub, "poison", idempotency.IsPoison)
//
// It is false for everything that must come back: a key in progress
// ([*InProgressError]), a store error (even one the store marks
// permanent, such as a missing table, which an operator will fix), a lost
// lease, a cancelled delivery, and the handler's own errors. A plain
// PoisonQueue would ack all of those: a duplicate whose key is in progress
// would be acked while its holder may still fail, and the message lost.
//
// To tell one kind of poison from another, match its sentinel error with
// [errors.Is].
func IsPoison(err error) bool {
	return errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrFingerprintMismatch) ||
		errors.Is(err, ErrOutputTooLarge) || errors.Is(err, backends.ErrCorruptOutput)
}

// InProgressError is returned for a delivery whose key was still in
// progress (held by the live lease of another delivery) when its wait
// ended. The message is nacked, never acked: if the holder fails, this
// delivery must be able to come back.
type InProgressError struct {
	// Key is the full key.
	Key string
	// Remaining is the holder's remaining lease when last seen: after that
	// the key is either completed or free. A broker that can delay a
	// redelivery should delay it by about this much.
	Remaining time.Duration
	// Waited is how long this delivery waited.
	Waited time.Duration
}

// Error implements error.
func (e *InProgressError) Error() string {
	return fmt.Sprintf("idempotency: key %q is in progress elsewhere (waited %v, holder's lease has %v left)",
		e.Key, e.Waited.Round(time.Millisecond), e.Remaining.Round(time.Millisecond))
}

// Is matches [ErrInProgress].
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }
