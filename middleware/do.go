package middleware

import (
	"context"
	"encoding/json"
	"fmt"
)

// DoOptions are the per-call settings of [DoWith]. The zero value is what
// [Do] uses.
type DoOptions struct {
	// Fingerprint identifies what the call is about, as Config.Fingerprint
	// does for messages: the store keeps the fingerprint the key was first
	// taken with, and a call with the same key and another fingerprint
	// fails with [ErrFingerprintMismatch] (whatever
	// Config.OnFingerprintMismatch says: that policy is for messages).
	// Empty: none is compared or recorded. One longer than
	// backends.MaxFingerprintBytes is recorded as its SHA-256.
	Fingerprint string

	// Origin names the call in the key's record, for `idem inspect`: a
	// request ID, a job run. Cut to backends.MaxOriginBytes. Defaults to
	// "do".
	Origin string

	// NoWait makes a call whose key is in progress fail at once with an
	// [*InProgressError], instead of waiting for the holder
	// (Timing.InProgressWait) to complete (the call then returns the
	// holder's result) or to give the key up (the call then runs fn).
	NoWait bool

	// Codec encodes fn's result for the store, and decodes it for the
	// duplicates that replay it. Defaults to [JSONCodec].
	Codec Codec

	// CompletionOutput, if set, is what [CompletionOutput] returns while
	// fn runs: the output to record for duplicates when fn completes its
	// own key in its own transaction (contrib/sqloutbox's WithTx), for a
	// function that knows what it returns before it commits. It must be
	// what Codec encodes fn's result to. package httpidem sets it to the
	// response written so far. Defaults to none: such a completion records
	// no output, and its duplicates get the zero value of T.
	CompletionOutput func() ([]byte, error)
}

// Codec encodes and decodes the results [Do] stores. It must decode what
// it encoded into a value of the same type.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSONCodec is the default [Codec]: encoding/json.
type JSONCodec struct{}

// Marshal implements [Codec] with json.Marshal.
func (JSONCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal implements [Codec] with json.Unmarshal.
func (JSONCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// Do runs fn at most once to completion per key, with the guarantees the
// middleware gives a Watermill handler: fn runs under a lease on
// Config.Namespace + ":" + key, renewed while it runs, whose fencing token
// it finds with [LeaseFromContext]; a call whose key is completed returns
// the result stored with the completion, without running fn; a call whose
// key is in progress waits for the holder (Timing.InProgressWait); a
// failure of fn releases the key, so that the next call runs it.
//
// It returns fn's result and error when fn ran, the stored result when
// the key was completed, or an error saying why fn did not run: an
// [*InProgressError] (the key is still held), a [*KeyError]
// ([ErrNoNamespace] without Config.Namespace, an empty or too long key),
// an error wrapping [ErrStore], [ErrFingerprintMismatch],
// [ErrOutputTooLarge] (the encoded result does not fit
// Config.MaxOutputBytes; the key was released) or backends.ErrLeaseLost
// (the lease was lost while fn ran: its result must not be used). The
// Config's policies apply as to messages (OnKeyError, OnStoreError), and
// its Observer and Logger see each call as a delivery without a message
// UUID or handler. ctx is fn's context, with the lease added; when ctx is
// cancelled, a call waiting for a slot or for the holder gives up.
//
// The result is stored encoded by [JSONCodec]; [DoWith] takes another
// Codec, a fingerprint and an origin. A result that fails to encode is a
// failure of fn: the key is released. A function that completes its key
// in its own transaction (contrib/sqloutbox's WithTx) records no result
// unless DoOptions.CompletionOutput says what: its duplicates get the zero
// value of T.
func Do[T any](ctx context.Context, idem *Idempotency, key string, fn func(context.Context) (T, error)) (T, error) {
	return DoWith(ctx, idem, key, DoOptions{}, fn)
}

// DoWith is [Do] with per-call options.
func DoWith[T any](ctx context.Context, idem *Idempotency, key string, opts DoOptions, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	if idem == nil {
		return zero, fmt.Errorf("%w: a nil *Idempotency", ErrInvalidConfig)
	}
	if fn == nil {
		return zero, fmt.Errorf("%w: a nil function", ErrInvalidConfig)
	}
	fd := &funcDelivery[T]{funcWork: funcWork[T]{fn: fn, codec: opts.Codec, tx: opts.CompletionOutput}}
	d, w := &fd.delivery, &fd.funcWork
	if w.codec == nil || isNil(w.codec) {
		w.codec = JSONCodec{}
	}
	idem.initDelivery(d, ctx, w)
	d.noWait, d.mismatch = opts.NoWait, MismatchReject
	full, err := idem.fullKey(idem.cfg.Namespace, key, "")
	if err == nil {
		d.key, d.fp = full, fingerprintBytes(opts.Fingerprint)
		d.origin = cleanOrigin(opts.Origin)
		if opts.Origin == "" {
			d.origin = "do"
		}
	}
	err = idem.handle(d, err)
	return w.v, err
}

type funcDelivery[T any] struct {
	delivery
	funcWork[T]
}

// funcWork runs a function given to [Do]: its output is its result,
// encoded by the codec.
type funcWork[T any] struct {
	fn    func(context.Context) (T, error)
	codec Codec
	tx    func() ([]byte, error) // DoOptions.CompletionOutput
	v     T
}

func (w *funcWork[T]) run(ctx context.Context) ([]byte, error) {
	v, err := w.fn(ctx)
	w.v = v
	if err != nil {
		return nil, err
	}
	out, err := w.codec.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("idempotency: encoding the result: %w", err)
	}
	return out, nil
}

func (w *funcWork[T]) replay(output []byte) (int, error) {
	var v T
	if len(output) > 0 {
		if err := w.codec.Unmarshal(output, &v); err != nil {
			return 0, fmt.Errorf("decoding the result as %T: %w", v, err)
		}
	}
	w.v = v
	return 0, nil
}

// txOutput is DoOptions.CompletionOutput's, or none: fn's result is not
// known until it returns.
func (w *funcWork[T]) txOutput() ([]byte, error) {
	if w.tx == nil {
		return nil, nil
	}
	return w.tx()
}
