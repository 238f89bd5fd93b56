package storekit

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/watermill-idempotency/idempotency/backends"
)

// ValidateAcquire reports whether an Acquire request is within the
// contract's limits (its key, owner, lease TTL, retention and
// fingerprint), wrapping [backends.ErrInvalidRequest] if not. A store
// calls it in Acquire before it touches the server.
func ValidateAcquire(req backends.AcquireRequest) error {
	if err := validateKeyOwner(req.Key, req.Owner); err != nil {
		return err
	}
	if err := ValidateLeaseTTL(req.LeaseTTL); err != nil {
		return err
	}
	if len(req.Fingerprint) > backends.MaxFingerprintBytes {
		return fmt.Errorf("%w: fingerprint of %d bytes, the limit is %d", backends.ErrInvalidRequest, len(req.Fingerprint), backends.MaxFingerprintBytes)
	}
	switch o := req.Origin; {
	case len(o) > backends.MaxOriginBytes:
		return fmt.Errorf("%w: origin of %d bytes, the limit is %d", backends.ErrInvalidRequest, len(o), backends.MaxOriginBytes)
	case !utf8.ValidString(o) || strings.IndexByte(o, 0) >= 0:
		return fmt.Errorf("%w: origin %q is not UTF-8 text without NUL", backends.ErrInvalidRequest, o)
	}
	return ValidateRetention(req.Retention)
}

// ValidateLease reports whether a lease can be sent to a store (its key
// and owner within the contract's limits), wrapping
// [backends.ErrInvalidRequest] if not. A store calls it in Renew,
// Complete and Release before it touches the server.
func ValidateLease(l backends.Lease) error { return validateKeyOwner(l.Key, l.Owner) }

// ValidateKey reports whether key is within the contract's limits (1 to
// [backends.MaxKeyBytes] bytes), wrapping [backends.ErrInvalidRequest] if
// not. A store calls it in Inspect and Delete before it touches the
// server, so that every store gives the same answer for a key no record
// can have.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", backends.ErrInvalidRequest)
	case len(key) > backends.MaxKeyBytes:
		return fmt.Errorf("%w: key of %d bytes, the limit is %d", backends.ErrInvalidRequest, len(key), backends.MaxKeyBytes)
	}
	return nil
}

func validateKeyOwner(key, owner string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	switch {
	case owner == "":
		return fmt.Errorf("%w: empty owner", backends.ErrInvalidRequest)
	case len(owner) > backends.MaxOwnerBytes:
		return fmt.Errorf("%w: owner of %d bytes, the limit is %d", backends.ErrInvalidRequest, len(owner), backends.MaxOwnerBytes)
	case !utf8.ValidString(owner) || strings.IndexByte(owner, 0) >= 0:
		return fmt.Errorf("%w: owner %q is not UTF-8 text without NUL", backends.ErrInvalidRequest, owner)
	}
	return nil
}

// ValidateLeaseTTL reports whether a lease TTL (for Acquire or Renew) is
// positive and at most [backends.MaxDuration], wrapping
// [backends.ErrInvalidRequest] if not.
func ValidateLeaseTTL(d time.Duration) error {
	if d <= 0 || d > backends.MaxDuration {
		return fmt.Errorf("%w: lease TTL out of range (above 0, at most %v): %v", backends.ErrInvalidRequest, backends.MaxDuration, d)
	}
	return nil
}

// ValidateRetention reports whether a retention is zero to
// [backends.MaxDuration], wrapping [backends.ErrInvalidRequest] if not.
func ValidateRetention(d time.Duration) error {
	if d < 0 || d > backends.MaxDuration {
		return fmt.Errorf("%w: retention out of range (0 to %v): %v", backends.ErrInvalidRequest, backends.MaxDuration, d)
	}
	return nil
}
