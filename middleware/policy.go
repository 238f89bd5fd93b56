package middleware

// Every policy has the same shape (see the package doc, Policies): an
// enum whose zero value rejects.

// KeyErrorPolicy decides what happens to a message without a usable key:
// the extractor found none, or the full key is longer than
// Config.MaxKeyBytes, or there is no namespace.
type KeyErrorPolicy int

const (
	// KeyErrorReject returns a [*KeyError] from the handler, so the message
	// is nacked and [IsPoison] routes it to a poison queue. The default.
	KeyErrorReject KeyErrorPolicy = iota
	// KeyErrorRunUnprotected runs the handler without a lease and reports
	// [OutcomeUnprotected]: duplicates of such a message each run.
	KeyErrorRunUnprotected
)

// MismatchPolicy decides what happens when a message's fingerprint differs
// from the one its key's record was first acquired with: the same key was
// used for a different payload.
type MismatchPolicy int

const (
	// MismatchReject returns an error wrapping [ErrFingerprintMismatch]
	// without running the handler, so the message is nacked and
	// [IsPoison] routes it to a poison queue. The default.
	MismatchReject MismatchPolicy = iota
	// MismatchIgnore treats the message as any other delivery of its key
	// and reports the mismatch only in [Event.FingerprintMismatch].
	MismatchIgnore
)

// StoreErrorPolicy decides what happens to a message when the store fails
// before the handler could take a lease: it cannot be reached, or refuses
// the call.
type StoreErrorPolicy int

const (
	// StoreErrorReject returns an error wrapping [ErrStore], after a pause
	// (Timing.StoreBackoff), so the message is nacked and comes back once
	// the store may answer: fail closed. The default.
	StoreErrorReject StoreErrorPolicy = iota
	// StoreErrorRunUnprotected runs the handler without a lease and
	// reports [OutcomeUnprotected]: fail open. Duplicates may then run
	// concurrently and twice.
	StoreErrorRunUnprotected
)
