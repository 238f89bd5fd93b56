package middleware

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

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
	// ErrPermanent is matched by every error made with [Permanent]: the
	// handler said the message can never succeed.
	ErrPermanent = errors.New("idempotency: permanent failure")
)

// Permanent marks err, returned by a handler, as one that will never
// succeed however often the message is redelivered: a payload the handler
// cannot parse, an order for a product that does not exist. It returns nil
// for a nil err.
//
//	var order Order
//	if err := json.Unmarshal(msg.Payload, &order); err != nil {
//		return nil, idempotency.Permanent(err)
//	}
//
// The middleware treats such a failure as any handler error, except for
// what comes after: the key is released, not completed, so that a fixed
// deploy can process a redelivery; the delivery ends as
// [OutcomeHandlerFailedPermanently]; [IsPoison] is true for it, so
// Watermill's PoisonQueueWithFilter moves the message to the poison topic,
// and [ShouldRetry] keeps Watermill's Retry middleware from retrying it.
// Without a poison queue the message is nacked, and its repeats are
// paced as every permanent failure is (Timing.PoisonBackoff). The
// returned error matches [ErrPermanent] and err under [errors.Is].
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// PermanentError is the error [Permanent] returns.
type PermanentError struct {
	// Err is the handler's error.
	Err error
}

// Error implements error: it is Err's message.
func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *PermanentError) Unwrap() error { return e.Err }

// Is matches [ErrPermanent].
func (e *PermanentError) Is(target error) bool { return target == ErrPermanent }

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
// (backends.ErrCorruptOutput), or a handler error marked with [Permanent]
// ([ErrPermanent]). Use it as the filter of Watermill's
// PoisonQueueWithFilter, outside this middleware, to move such messages
// out of the way:
//
//	poison, err := middleware.PoisonQueueWithFilter(pub, "poison", idempotency.IsPoison)
//
// It is false for everything that must come back: a key in progress
// ([*InProgressError]), a store error (even one the store marks
// permanent, such as a missing table, which an operator will fix), a lost
// lease, a cancelled delivery, and the handler's other errors. A plain
// PoisonQueue would ack all of those: a duplicate whose key is in progress
// would be acked while its holder may still fail, and the message lost.
// What must come back wins: an error that matches [ErrInProgress] or
// backends.ErrLeaseLost is not poison, whatever else it wraps (a handler
// that returned a [Permanent] error after its lease was lost).
//
// To tell one kind of poison from another, match its sentinel error with
// [errors.Is].
func IsPoison(err error) bool {
	if err == nil || errors.Is(err, ErrInProgress) || errors.Is(err, backends.ErrLeaseLost) {
		return false
	}
	return errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrFingerprintMismatch) ||
		errors.Is(err, ErrOutputTooLarge) || errors.Is(err, backends.ErrCorruptOutput) ||
		errors.Is(err, ErrPermanent)
}

// ShouldRetry is a ShouldRetry function for Watermill's Retry middleware:
// it retries every error but poison ([IsPoison]), which fails the same
// way on every attempt, a [Permanent] handler error included.
//
//	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, ShouldRetry: idempotency.ShouldRetry}
func ShouldRetry(p middleware.RetryParams) bool { return !IsPoison(p.Err) }

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
