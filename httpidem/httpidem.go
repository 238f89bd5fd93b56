package httpidem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// Header is the request header that carries the idempotency key.
const Header = "Idempotency-Key"

// ReplayedHeader is set to "true" on a response replayed from the store.
const ReplayedHeader = "Idempotent-Replayed"

// Defaults applied by [New] to zero [Config] fields.
const (
	// DefaultMaxKeyBytes is the default of Config.MaxKeyBytes.
	DefaultMaxKeyBytes = 255
	// DefaultMaxRequestBytes is the default of Config.MaxRequestBytes.
	DefaultMaxRequestBytes = 1 << 20
)

// DefaultReplayHeaders are the response headers stored and replayed by
// default: what describes the representation and where it is, never
// per-response headers such as Date or Set-Cookie.
var DefaultReplayHeaders = []string{
	"Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language", "Content-Location",
	"Content-Type", "ETag", "Expires", "Last-Modified", "Location", "Vary",
}

// InProgressPolicy says what a request gets while the original request
// with its key is still being processed.
type InProgressPolicy int

const (
	// Conflict answers 409 Conflict at once, with a Retry-After of the
	// original's remaining lease, as the draft says. The default.
	Conflict InProgressPolicy = iota
	// Wait waits for the original (the Idempotency's
	// Timing.InProgressWait) and replays its response, or runs the
	// request if the original failed; 409 if it is still running when the
	// wait ends.
	Wait
)

// ErrInvalidConfig is wrapped by every error [New] returns.
var ErrInvalidConfig = errors.New("httpidem: invalid config")

// Config configures the middleware. Only Idempotency is required; [New]
// fills the zero fields with defaults in its own copy.
type Config struct {
	// Idempotency is the engine: its store, lease, retention, timings,
	// observer and logger serve the requests, as they serve messages and
	// calls of idempotency.Do. Its Config.Namespace is required: the key
	// space of the requests. Required.
	Idempotency *idempotency.Idempotency

	// Required makes the key mandatory: a request without it is refused
	// with 400 Bad Request. Otherwise such a request passes through to
	// the handler, unprotected.
	Required bool

	// Scope returns whom the request's key belongs to (a tenant, an API
	// key's account, a user), so that two clients that choose the same
	// key do not see each other's responses. It is part of the stored
	// key, which `idem list` shows: return an account ID or a hash, not a
	// secret. An error refuses the request with 400 Bad Request: answer
	// 401 or 403 with an authentication middleware before this one.
	// Defaults to none: keys are global to the route.
	Scope func(r *http.Request) (string, error)

	// Fingerprint returns what identifies the request's content: a
	// request that reuses a key with another fingerprint is refused with
	// 422 Unprocessable Content. body is the request body. An empty
	// fingerprint compares nothing; an error refuses the request with 400
	// Bad Request. Defaults to the SHA-256 of the method, the path and
	// query, and the body.
	Fingerprint func(r *http.Request, body []byte) (string, error)

	// InProgress says what a request gets while the original request with
	// its key is still running. Defaults to Conflict.
	InProgress InProgressPolicy

	// Stored says which statuses complete the key: the response is stored
	// and replayed to every later request with the key, until the
	// Idempotency's Retention ends. Any other status releases the key, so
	// that the client's retry runs again. Defaults to [DefaultStored].
	Stored func(status int) bool

	// ReplayHeaders are the response headers stored with the response and
	// replayed. Defaults to [DefaultReplayHeaders].
	ReplayHeaders []string

	// MaxKeyBytes is the longest key accepted; a longer one is refused
	// with 400 Bad Request. Defaults to 255.
	MaxKeyBytes int

	// MaxRequestBytes is the largest request body read (to fingerprint
	// it, and then given to the handler); a larger one is refused with
	// 413 Content Too Large. Defaults to 1 MiB.
	MaxRequestBytes int64

	// MaxResponseBytes is the largest response body stored. A handler
	// that writes more gets its response streamed to the client as it
	// writes, and the key is released: a retry runs again. Defaults to the
	// Idempotency's MaxOutputBytes less 4 KiB for the status and headers.
	MaxResponseBytes int

	// ProblemType is the "type" of the application/problem+json bodies
	// (RFC 9457) of the middleware's own refusals: a URI that documents
	// your API's use of the header. Defaults to "about:blank", whose
	// title is the status's.
	ProblemType string
}

// DefaultStored is the default of Config.Stored: 1xx to 4xx, except the
// statuses that ask the client to try again (408 Request Timeout, 409
// Conflict, 425 Too Early, 429 Too Many Requests). A 5xx releases the key.
func DefaultStored(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

// Middleware is the net/http middleware. Create it with [New].
type Middleware struct {
	cfg    Config
	codec  responseCodec
	maxKey int // the longest store key within the namespace
}

// New returns the middleware for cfg, or an error wrapping
// [ErrInvalidConfig] that lists every invalid field.
func New(cfg Config) (*Middleware, error) {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(cfg.Idempotency != nil, "Idempotency is required")
	var engine idempotency.Config
	if cfg.Idempotency != nil {
		engine = cfg.Idempotency.Config()
	}
	check(cfg.Idempotency == nil || engine.Namespace != "", "Idempotency has no Namespace: set its Config.Namespace, the key space of the requests")
	if cfg.Stored == nil {
		cfg.Stored = DefaultStored
	}
	if cfg.ReplayHeaders == nil {
		cfg.ReplayHeaders = DefaultReplayHeaders
	}
	if cfg.MaxKeyBytes == 0 {
		cfg.MaxKeyBytes = DefaultMaxKeyBytes
	}
	if cfg.MaxRequestBytes == 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if cfg.MaxResponseBytes == 0 && cfg.Idempotency != nil {
		cfg.MaxResponseBytes = max(engine.MaxOutputBytes-4<<10, 1)
	}
	if cfg.ProblemType == "" {
		cfg.ProblemType = "about:blank"
	}
	check(cfg.InProgress == Conflict || cfg.InProgress == Wait, "InProgress: unknown policy %d", cfg.InProgress)
	check(cfg.MaxKeyBytes > 0, "MaxKeyBytes must be positive, got %d", cfg.MaxKeyBytes)
	check(cfg.MaxRequestBytes > 0, "MaxRequestBytes must be positive, got %d", cfg.MaxRequestBytes)
	check(cfg.MaxResponseBytes > 0, "MaxResponseBytes must be positive, got %d", cfg.MaxResponseBytes)
	maxKey := engine.MaxKeyBytes - len(engine.Namespace) - 1
	if cfg.Idempotency != nil {
		check(cfg.MaxResponseBytes <= engine.MaxOutputBytes, "MaxResponseBytes (%d) must be at most the Idempotency's MaxOutputBytes (%d)", cfg.MaxResponseBytes, engine.MaxOutputBytes)
		check(engine.Namespace == "" || maxKey >= hashedKeyBytes, "the Idempotency's MaxKeyBytes (%d) leaves %d bytes after its Namespace; a request's key takes up to %d once hashed", engine.MaxKeyBytes, maxKey, hashedKeyBytes)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	cfg.ReplayHeaders = append([]string(nil), cfg.ReplayHeaders...)
	return &Middleware{cfg: cfg, codec: newResponseCodec(cfg.ReplayHeaders), maxKey: maxKey}, nil
}

// Handler wraps next: a request with an Idempotency-Key runs next at most
// once to completion per key (see the package documentation). Its
// signature is that of chi's, gorilla's and most routers' middleware.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	values := r.Header.Values(Header)
	switch {
	case len(values) == 0 && !m.cfg.Required:
		next.ServeHTTP(w, r)
		return
	case len(values) == 0:
		m.problem(w, http.StatusBadRequest, "This operation is idempotent and requires an Idempotency-Key header.", 0)
		return
	case len(values) > 1:
		m.problem(w, http.StatusBadRequest, "The request has more than one Idempotency-Key header.", 0)
		return
	}
	key, err := parseKey(values[0])
	if err == nil && len(key) > m.cfg.MaxKeyBytes {
		err = fmt.Errorf("it is %d bytes long, the limit is %d", len(key), m.cfg.MaxKeyBytes)
	}
	if err != nil {
		m.problem(w, http.StatusBadRequest, "The Idempotency-Key header is invalid: "+err.Error()+".", 0)
		return
	}
	scope := ""
	if m.cfg.Scope != nil {
		if scope, err = m.cfg.Scope(r); err != nil {
			m.problem(w, http.StatusBadRequest, "The request's scope for its Idempotency-Key: "+err.Error()+".", 0)
			return
		}
	}
	body, err := readBody(r, m.cfg.MaxRequestBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			m.problem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("The request body is larger than %d bytes.", m.cfg.MaxRequestBytes), 0)
			return
		}
		m.problem(w, http.StatusBadRequest, "Reading the request body: "+err.Error()+".", 0)
		return
	}
	var fp string
	if m.cfg.Fingerprint != nil {
		fp, err = m.cfg.Fingerprint(r, body)
	} else {
		fp = defaultFingerprint(r, body)
	}
	if err != nil {
		m.problem(w, http.StatusBadRequest, "Fingerprinting the request: "+err.Error()+".", 0)
		return
	}
	op := route(r)

	rec := newRecorder(w, m.cfg.MaxResponseBytes)
	ran := false
	resp, err := idempotency.DoWith(r.Context(), m.cfg.Idempotency, storeKey(op, scope, key, m.maxKey), idempotency.DoOptions{
		Fingerprint:      fp,
		Origin:           "http=" + strconv.Quote(op),
		NoWait:           m.cfg.InProgress == Conflict,
		Codec:            m.codec,
		CompletionOutput: func() ([]byte, error) { return m.codec.Marshal(rec.response()) },
	}, func(ctx context.Context) (*response, error) {
		ran = true
		next.ServeHTTP(rec, r.WithContext(ctx))
		resp := rec.response()
		switch {
		case rec.status == 0 && rec.body.Len() == 0 && ctx.Err() != nil:
			// The client left and the handler gave up without a word:
			// not a 200 to store.
			return nil, context.Cause(ctx)
		case rec.streaming:
			return nil, fmt.Errorf("%w: the response body is larger than %d bytes", idempotency.ErrOutputTooLarge, m.cfg.MaxResponseBytes)
		case !m.cfg.Stored(resp.status):
			return resp, &notStoredError{status: resp.status}
		}
		return resp, nil
	})
	switch {
	case ran && rec.streaming:
		// The client has the response already; the key was released.
	case ran && errors.Is(err, backends.ErrLeaseLost):
		// Another request may hold the key: the response is not the one
		// the key will keep. The client retries and gets that one.
		m.problem(w, http.StatusServiceUnavailable, "The request lost its hold on its Idempotency-Key while it ran; retry it.", time.Second)
	case ran:
		rec.flush() // completed, released (a status not stored), or not recorded: the client gets what the handler wrote
	case err == nil:
		resp.write(w, true)
	default:
		m.refuse(w, err)
	}
}

// refuse answers a request whose handler did not run.
func (m *Middleware) refuse(w http.ResponseWriter, err error) {
	var inProgress *idempotency.InProgressError
	switch {
	case errors.As(err, &inProgress):
		m.problem(w, http.StatusConflict, "A request with the same Idempotency-Key for the same operation is being processed.", inProgress.Remaining)
	case errors.Is(err, idempotency.ErrFingerprintMismatch):
		m.problem(w, http.StatusUnprocessableEntity, "The Idempotency-Key was used with another request payload for this operation; use a new key for a new request.", 0)
	case errors.Is(err, idempotency.ErrInvalidKey):
		m.problem(w, http.StatusBadRequest, "The Idempotency-Key cannot be used: "+err.Error()+".", 0)
	case errors.Is(err, errCorrupt):
		// Retrying cannot help: the key holds something other than a
		// response (a key of the namespace completed by another door).
		m.problem(w, http.StatusInternalServerError, "The response stored for this Idempotency-Key cannot be read.", 0)
	default: // the store failed, or the client left
		m.problem(w, http.StatusServiceUnavailable, "The request could not be checked against earlier requests with its Idempotency-Key; retry it.", time.Second)
	}
}

// notStoredError is fn's error for a response whose status does not
// complete the key: the engine releases it.
type notStoredError struct{ status int }

func (e *notStoredError) Error() string {
	return fmt.Sprintf("httpidem: status %d is not stored; the key is released", e.status)
}

// route names the operation: the ServeMux pattern that matched, with the
// method if the pattern has none, or the method and path.
func route(r *http.Request) string {
	switch {
	case r.Pattern == "":
		return r.Method + " " + r.URL.Path
	case strings.HasPrefix(r.Pattern, "/") || !strings.Contains(r.Pattern, " "):
		return r.Method + " " + r.Pattern
	}
	return r.Pattern
}

// storeKey is the key in the store, within the namespace:
// "<route>|<scope>|<key>", route and scope with '%' and '|' escaped, so
// that no two requests' triples make one key. Longer than limit, the route
// and scope are replaced by their SHA-256, then the whole.
func storeKey(op, scope, key string, limit int) string {
	op, scope = escape(op), escape(scope)
	k := op + "|" + scope + "|" + key
	if len(k) <= limit {
		return k
	}
	sum := sha256.Sum256([]byte(op + "|" + scope))
	k = hashPrefix + hex.EncodeToString(sum[:]) + "|" + key
	if len(k) <= limit {
		return k
	}
	all := sha256.Sum256([]byte(k))
	return hashPrefix + hex.EncodeToString(all[:])
}

// hashPrefix starts a hashed key or part; a route never does, since it
// holds a space.
const hashPrefix = "sha256:"

// hashedKeyBytes is the length of a key hashed whole, the longest
// storeKey returns when it must hash.
const hashedKeyBytes = len(hashPrefix) + 2*sha256.Size

var escaper = strings.NewReplacer("%", "%25", "|", "%7C")

// escape escapes '%' and '|' in s.
func escape(s string) string {
	if !strings.ContainsAny(s, "%|") {
		return s
	}
	return escaper.Replace(s)
}

// readBody reads r's body, at most limit bytes (a larger one is an
// *http.MaxBytesError), and gives it back to r for the handler.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
}

// defaultFingerprint is the SHA-256 of the method, the path and query,
// and the body.
func defaultFingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	h.Write([]byte(r.Method + " " + r.URL.RequestURI() + "\n"))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// retryAfter is d in whole seconds, rounded up, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.FormatInt(max(int64(math.Ceil(d.Seconds())), 1), 10)
}
