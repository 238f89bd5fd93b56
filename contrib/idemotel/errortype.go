package idemotel

import (
	"context"
	"errors"
	"net"

	"github.com/watermill-idempotency/idempotency/backends"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// The values of the error.type attribute. Each names a class of failure,
// never anything taken from an error's text, so the attribute keeps a low
// cardinality.
const (
	// ErrorLeaseLost: the lease was no longer held (backends.ErrLeaseLost).
	ErrorLeaseLost = "lease_lost"
	// ErrorInvalidRequest: the store refused a malformed request
	// (backends.ErrInvalidRequest).
	ErrorInvalidRequest = "invalid_request"
	// ErrorRejected: the store refused the call for good (backends.ErrRejected).
	ErrorRejected = "rejected"
	// ErrorNotFound: the key has no record (backends.ErrNotFound, from
	// Inspect and Delete).
	ErrorNotFound = "not_found"
	// ErrorTimeout: a deadline passed (context.DeadlineExceeded or a
	// network timeout).
	ErrorTimeout = "timeout"
	// ErrorCanceled: the call was cancelled (context.Canceled), as when the
	// router closes.
	ErrorCanceled = "canceled"
	// ErrorKey: the message had no usable key (middleware.ErrInvalidKey).
	ErrorKey = "key_error"
	// ErrorInProgress: the key was in progress, held by the live lease of
	// another delivery (middleware.ErrInProgress).
	ErrorInProgress = "in_progress"
	// ErrorFingerprintMismatch: the key's record is for another payload.
	ErrorFingerprintMismatch = "fingerprint_mismatch"
	// ErrorOutputTooLarge: the handler's output was too large to store.
	ErrorOutputTooLarge = "output_too_large"
	// ErrorCorruptOutput: the stored output could not be decoded.
	ErrorCorruptOutput = "corrupt_output"
	// ErrorPermanent: the handler said the message can never succeed
	// (middleware.Permanent, matching middleware.ErrPermanent).
	ErrorPermanent = "permanent"
	// ErrorOther is every other error: OpenTelemetry's fallback value.
	ErrorOther = "_OTHER"
)

// ErrorType returns the error.type value for err: one of the Error
// constants, checked in the order they are declared. It is what the
// observer and the instrumented store record, and the fallback of
// Config.ErrorType.
func ErrorType(err error) string {
	switch {
	case errors.Is(err, backends.ErrLeaseLost):
		return ErrorLeaseLost
	case errors.Is(err, backends.ErrInvalidRequest):
		return ErrorInvalidRequest
	case errors.Is(err, backends.ErrRejected):
		return ErrorRejected
	case errors.Is(err, backends.ErrNotFound):
		return ErrorNotFound
	case isTimeout(err):
		return ErrorTimeout
	case errors.Is(err, context.Canceled):
		return ErrorCanceled
	case errors.Is(err, idempotency.ErrInvalidKey):
		return ErrorKey
	case errors.Is(err, idempotency.ErrInProgress):
		return ErrorInProgress
	case errors.Is(err, idempotency.ErrFingerprintMismatch):
		return ErrorFingerprintMismatch
	case errors.Is(err, idempotency.ErrOutputTooLarge):
		return ErrorOutputTooLarge
	case errors.Is(err, backends.ErrCorruptOutput):
		return ErrorCorruptOutput
	case errors.Is(err, idempotency.ErrPermanent):
		return ErrorPermanent
	}
	return ErrorOther
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
