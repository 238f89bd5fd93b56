package keyfunc

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/tidwall/gjson"
)

// Errors an extractor's key may fail with. Compare with [errors.Is].
var (
	// ErrNoKey means the message has no key where the extractor looks.
	ErrNoKey = errors.New("keyfunc: no key")
	// ErrMalformedPayload means the payload could not be parsed.
	ErrMalformedPayload = errors.New("keyfunc: malformed payload")
	// ErrUnsupportedValue means the field holds a value that is not a
	// usable key (only strings and numbers are).
	ErrUnsupportedValue = errors.New("keyfunc: unsupported key value")
	// ErrInvalidExtractor is returned by [Validate] for an extractor that
	// was built wrongly (an empty metadata name or JSON path, no parts).
	ErrInvalidExtractor = errors.New("keyfunc: invalid extractor")
)

// Extractor returns a message's idempotency key. Implementations must be
// safe for concurrent use and must not modify the message.
type Extractor interface {
	Key(msg *message.Message) (string, error)
}

// Func adapts a function to an [Extractor]: the user's own key logic.
type Func func(msg *message.Message) (string, error)

// Key calls f(msg).
func (f Func) Key(msg *message.Message) (string, error) { return f(msg) }

// Validate reports whether e was built correctly. Extractors from this
// package check their arguments; other extractors may implement
// interface{ Validate() error } to take part. A nil extractor is invalid.
func Validate(e Extractor) error {
	if e == nil {
		return fmt.Errorf("%w: nil", ErrInvalidExtractor)
	}
	if f, ok := e.(Func); ok && f == nil {
		return fmt.Errorf("%w: nil Func", ErrInvalidExtractor)
	}
	if v, ok := e.(interface{ Validate() error }); ok {
		return v.Validate()
	}
	return nil
}

// UUID returns an extractor that uses the message UUID. An empty UUID is
// [ErrNoKey].
func UUID() Extractor { return uuidExtractor{} }

type uuidExtractor struct{}

func (uuidExtractor) Key(msg *message.Message) (string, error) {
	if msg.UUID == "" {
		return "", fmt.Errorf("%w: message UUID is empty", ErrNoKey)
	}
	return msg.UUID, nil
}

// Metadata returns an extractor that uses the named metadata field. A
// missing or empty field is [ErrNoKey].
func Metadata(name string) Extractor { return metadataExtractor(name) }

type metadataExtractor string

func (m metadataExtractor) Validate() error {
	if m == "" {
		return fmt.Errorf("%w: Metadata needs a field name", ErrInvalidExtractor)
	}
	return nil
}

func (m metadataExtractor) Key(msg *message.Message) (string, error) {
	if v := msg.Metadata.Get(string(m)); v != "" {
		return v, nil
	}
	return "", fmt.Errorf("%w: metadata %q is missing or empty", ErrNoKey, string(m))
}

// JSONField returns an extractor that reads a field of a JSON payload. The
// path names one object member per level, so JSONField("order", "id")
// reads {"order": {"id": ...}}; names are taken literally (dots, stars and
// other characters have no special meaning).
//
// A string field gives its text and a number its literal text as written
// (so 42 and 42.0 are different keys). A missing field or an empty string
// is [ErrNoKey]; an object, array, boolean or null is [ErrUnsupportedValue];
// a payload that is not valid JSON is [ErrMalformedPayload], even when the
// field itself could be read.
func JSONField(path ...string) Extractor {
	escaped := make([]string, len(path))
	for i, p := range path {
		escaped[i] = gjson.Escape(p)
	}
	return jsonExtractor{path: path, query: strings.Join(escaped, ".")}
}

type jsonExtractor struct {
	path  []string
	query string
}

func (j jsonExtractor) Validate() error {
	if len(j.path) == 0 {
		return fmt.Errorf("%w: JSONField needs a path", ErrInvalidExtractor)
	}
	for _, p := range j.path {
		if p == "" {
			return fmt.Errorf("%w: JSONField path %q has an empty name", ErrInvalidExtractor, j.path)
		}
	}
	return nil
}

func (j jsonExtractor) Key(msg *message.Message) (string, error) {
	if !gjson.ValidBytes(msg.Payload) {
		return "", fmt.Errorf("%w: payload is not valid JSON", ErrMalformedPayload)
	}
	r := gjson.GetBytes(msg.Payload, j.query)
	switch r.Type {
	case gjson.String:
		if r.Str != "" {
			return r.Str, nil
		}
		return "", fmt.Errorf("%w: JSON field %q is an empty string", ErrNoKey, j.path)
	case gjson.Number:
		return r.Raw, nil
	case gjson.Null:
		if !r.Exists() {
			return "", fmt.Errorf("%w: JSON field %q is missing", ErrNoKey, j.path)
		}
		return "", fmt.Errorf("%w: JSON field %q is null", ErrUnsupportedValue, j.path)
	case gjson.JSON:
		return "", fmt.Errorf("%w: JSON field %q is an object or array", ErrUnsupportedValue, j.path)
	default: // gjson.True, gjson.False
		return "", fmt.Errorf("%w: JSON field %q is a boolean", ErrUnsupportedValue, j.path)
	}
}

// PayloadHash returns an extractor that uses the hex SHA-256 of the
// payload (64 characters): as a key, identical payloads are the same work;
// as the middleware's Config.Fingerprint, a key reused for another payload
// is told from a duplicate. An empty payload is [ErrNoKey]: every empty
// message would otherwise be the same work.
func PayloadHash() Extractor { return payloadHashExtractor{} }

type payloadHashExtractor struct{}

func (payloadHashExtractor) Key(msg *message.Message) (string, error) {
	if len(msg.Payload) == 0 {
		return "", fmt.Errorf("%w: payload is empty", ErrNoKey)
	}
	return hashHex(msg.Payload), nil
}

func hashHex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// First returns an extractor that tries each extractor in order and uses
// the first key found. If none finds one, the error joins all their errors,
// so [errors.Is] matches any of them.
func First(extractors ...Extractor) Extractor { return firstExtractor(extractors) }

type firstExtractor []Extractor

func (f firstExtractor) Validate() error { return validateAll("First", f) }

func (f firstExtractor) Key(msg *message.Message) (string, error) {
	errs := make([]error, 0, len(f))
	for _, e := range f {
		k, err := e.Key(msg)
		if err == nil {
			return k, nil
		}
		errs = append(errs, err)
	}
	return "", errors.Join(errs...)
}

// Composite returns an extractor whose key is every extractor's key joined
// by sep, for work identified by several fields together (a tenant and an
// order id). Every part must be found. Choose a sep that cannot occur in
// the parts, or the joined keys may be ambiguous.
func Composite(sep string, extractors ...Extractor) Extractor {
	return compositeExtractor{sep: sep, parts: extractors}
}

type compositeExtractor struct {
	sep   string
	parts []Extractor
}

func (c compositeExtractor) Validate() error { return validateAll("Composite", c.parts) }

func (c compositeExtractor) Key(msg *message.Message) (string, error) {
	keys := make([]string, len(c.parts))
	for i, e := range c.parts {
		k, err := e.Key(msg)
		if err != nil {
			return "", err
		}
		keys[i] = k
	}
	return strings.Join(keys, c.sep), nil
}

// Hashed returns an extractor whose key is the hex SHA-256 of e's key (64
// characters), for keys that may be long or hold data that should not be
// stored in the clear. e's errors are passed on.
func Hashed(e Extractor) Extractor { return hashedExtractor{e} }

type hashedExtractor struct{ inner Extractor }

func (h hashedExtractor) Validate() error { return Validate(h.inner) }

func (h hashedExtractor) Key(msg *message.Message) (string, error) {
	k, err := h.inner.Key(msg)
	if err != nil {
		return "", err
	}
	return hashHex([]byte(k)), nil
}

func validateAll(name string, es []Extractor) error {
	if len(es) == 0 {
		return fmt.Errorf("%w: %s needs at least one extractor", ErrInvalidExtractor, name)
	}
	for i, e := range es {
		if err := Validate(e); err != nil {
			return fmt.Errorf("%s extractor %d: %w", name, i, err)
		}
	}
	return nil
}
