package middleware

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
	"github.com/watermill-idempotency/idempotency/keyfunc"
)

// Defaults applied by [New] to zero-valued [Config] fields; [Timing] has
// its own.
const (
	// DefaultLeaseTTL is the default of Config.LeaseTTL.
	DefaultLeaseTTL = 30 * time.Second
	// DefaultRetention is the default of Config.Retention.
	DefaultRetention = 24 * time.Hour
	// DefaultMaxConcurrentAcquires is the default of
	// Config.MaxConcurrentAcquires for a store that does not report its
	// pool size (backends.PoolSizer).
	DefaultMaxConcurrentAcquires = 8
	// DefaultMaxKeyBytes is the default of Config.MaxKeyBytes.
	DefaultMaxKeyBytes = 512
	// DefaultMaxOutputBytes is the default of Config.MaxOutputBytes for a
	// store without a lower limit of its own (backends.OutputLimiter).
	DefaultMaxOutputBytes = 1 << 20

	// MinLeaseTTL is the shortest lease TTL [New] accepts. The lease is
	// renewed every third of its TTL, and stores keep time in milliseconds.
	MinLeaseTTL = 10 * time.Millisecond
)

// Config configures the middleware. Only Store is required; [New] fills
// the other zero fields with defaults in its own copy.
type Config struct {
	// Store keeps leases and completion records. Required.
	Store backends.Store

	// Key extracts the idempotency key from a message.
	// Defaults to keyfunc.UUID().
	Key keyfunc.Extractor

	// Namespace is prepended to every key as Namespace + ":" + key, so that
	// two handlers consuming the same topic each process a message once.
	// Defaults to the handler's name from the router; when the middleware
	// runs outside a router, the message is rejected with ErrNoNamespace
	// unless Namespace is set. Set it when handlers share work rather than
	// each doing its own: copies of one handler competing for a topic's
	// messages (orders-0 … orders-3), a handler that is renamed, several
	// services that must not each process a message.
	Namespace string

	// LeaseTTL is how long a processing lease lasts unless renewed. While
	// the handler runs, and while its completion or release is recorded,
	// the lease is renewed every LeaseTTL/3, and a failed renewal is tried
	// again every LeaseTTL/10. The lease counts as lost, and the handler's
	// context is cancelled, when it could not be renewed until LeaseTTL/10
	// (the margin) before it would run out. A crashed worker's lease is
	// taken over LeaseTTL after its last renewal. Set it near the broker's
	// redelivery delay (the SQS visibility timeout, the Redis Streams
	// MaxIdleTime). At least MinLeaseTTL. Defaults to 30 seconds.
	LeaseTTL time.Duration

	// Retention is how long a completed key is remembered, so duplicates
	// arriving within it are dropped. Released and expired records are kept
	// as long, so fencing tokens keep counting up. At least LeaseTTL: a
	// broker redelivers a copy about a lease TTL (its redelivery delay)
	// after the original, so a shorter retention forgets the key before
	// its duplicates arrive (a Retention of 24, meant as hours, is 24 ns).
	// Defaults to 24 hours.
	Retention time.Duration

	// CompletedCache is an opt-in local cache of completed keys: a
	// duplicate of a key this process completed, or saw completed, is
	// answered from memory with no store call. Its entries are stale by
	// up to CompletedCache.TTL: an operator's `idem delete` is not seen
	// until then (see [CompletedCache]). Off by default.
	CompletedCache CompletedCache

	// Timing holds every wait, timeout and pause: how long a delivery
	// waits for the holder of its key, how often it looks at the store
	// meanwhile, how long a store call may take, and how calls are spaced
	// after failures. Each zero field takes its default (see [Timing]).
	Timing Timing

	// MaxConcurrentAcquires bounds the Acquire calls this middleware has
	// in flight at once; further deliveries wait for a slot in arrival
	// order. Renewals, completions and releases are not bounded, so as
	// long as the store's client pool is larger than this bound, the
	// leases of running handlers are kept however many new deliveries
	// arrive. Keep it at most half the pool the store uses (go-redis:
	// PoolSize; pgxpool: MaxConns), and lower if other middleware
	// instances share that pool. Defaults to half the store's pool size
	// when the store reports it (backends.PoolSizer: redisstore, pgstore,
	// and mysqlstore with a limit set by SetMaxOpenConns do), otherwise 8.
	MaxConcurrentAcquires int

	// MaxKeyBytes is the longest full key (namespace included) accepted;
	// a longer one is a [*KeyError] wrapping [ErrKeyTooLong]. Wrap the
	// extractor in keyfunc.Hashed for long keys. At most
	// backends.MaxKeyBytes (2048), the longest key every store accepts.
	// Defaults to 512.
	MaxKeyBytes int

	// MaxOutputBytes is the largest encoded set of produced messages that
	// is stored with a completion for replay. A handler whose output is
	// larger fails with [ErrOutputTooLarge] and its lease is released.
	// At most the store's own limit, when it has one
	// (backends.OutputLimiter: dynamostore's is 392 KiB). Defaults to
	// 1 MiB, or the store's limit if that is lower.
	MaxOutputBytes int

	// Fingerprint, if set, extracts what identifies the content of a
	// message, as Key extracts what identifies its work: the store keeps
	// the fingerprint a key was first acquired with, and a later message
	// with the same key and another fingerprint is a key collision, not a
	// duplicate, handled by OnFingerprintMismatch. keyfunc.PayloadHash()
	// fingerprints the whole payload; keyfunc.JSONField or
	// keyfunc.Composite the fields that must agree. A fingerprint up to
	// backends.MaxFingerprintBytes (4 KiB) is recorded as it is, a longer
	// one as its SHA-256, so that any extractor works with every store. A
	// message whose fingerprint cannot be extracted (keyfunc.PayloadHash
	// of an empty payload, say) is handled without one: it is neither
	// compared nor recorded. Defaults to nil: no fingerprints.
	Fingerprint keyfunc.Extractor

	// OnKeyError decides what happens to a message without a usable key.
	// Defaults to KeyErrorReject.
	OnKeyError KeyErrorPolicy

	// OnFingerprintMismatch decides what happens to a message whose
	// fingerprint differs from the one its key was first seen with.
	// Defaults to MismatchReject.
	OnFingerprintMismatch MismatchPolicy

	// OnStoreError decides what happens to a message when the store fails
	// before a lease could be taken. Defaults to StoreErrorReject (fail
	// closed).
	OnStoreError StoreErrorPolicy

	// Logger receives one log line per delivery: failures (store errors,
	// lost leases, key errors, processed_not_recorded) at Error level, at
	// most one a second for each outcome (a line after left-out ones
	// carries their count as suppressed_since_last); duplicates, keys in
	// progress and cancelled deliveries at Debug; routine outcomes
	// (processed, handler failed) at Trace. Once per pair, at Info, two
	// handlers that take messages of one topic under the default
	// namespace. Defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter

	// Observer is told the outcome of every delivery, for metrics and
	// traces. Defaults to none (as does a nil pointer). [*Counters] is a
	// ready-made one; combine several with [MultiObserver].
	Observer Observer

	// ReplayDropMetadata lists metadata keys removed from the stored
	// messages replayed for a duplicate. A replayed message carries the
	// metadata its handler gave it when it was first produced, trace
	// propagation fields (traceparent, tracestate, baggage) included if
	// the handler set them; dropping those keeps a replay from claiming
	// the first delivery's trace. contrib/idemotel's PropagationKeys lists a
	// propagator's fields. Defaults to none: replays are exact copies.
	ReplayDropMetadata []string
}

// isNil reports whether s holds a nil pointer (or other nil value), such
// as a *memstore.Store that was never created.
func isNil(s any) bool { return storekit.IsNil(s) }

// ErrInvalidConfig is wrapped by every error [New] returns.
var ErrInvalidConfig = errors.New("idempotency: invalid config")

func (c Config) withDefaults() Config {
	if c.Key == nil {
		c.Key = keyfunc.UUID()
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	c.Timing = c.Timing.withDefaults()
	if c.MaxConcurrentAcquires == 0 {
		c.MaxConcurrentAcquires = DefaultMaxConcurrentAcquires
		if ps, ok := c.Store.(backends.PoolSizer); ok && !isNil(c.Store) && ps.PoolSize() > 0 {
			c.MaxConcurrentAcquires = max(1, ps.PoolSize()/2)
		}
	}
	if c.MaxKeyBytes == 0 {
		c.MaxKeyBytes = DefaultMaxKeyBytes
	}
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = DefaultMaxOutputBytes
		if limit := storeOutputLimit(c.Store); limit > 0 {
			c.MaxOutputBytes = min(c.MaxOutputBytes, limit)
		}
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	if c.Observer != nil && isNil(c.Observer) {
		c.Observer = nil // a nil *Counters, say: no observer
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Store != nil, "Store is required")
	check(c.Store == nil || !isNil(c.Store), "Store is a nil %T", c.Store)
	if err := keyfunc.Validate(c.Key); err != nil {
		errs = append(errs, fmt.Errorf("invalid Key: %w", err))
	}
	if c.Fingerprint != nil {
		if err := keyfunc.Validate(c.Fingerprint); err != nil {
			errs = append(errs, fmt.Errorf("invalid Fingerprint: %w", err))
		}
	}
	check(c.LeaseTTL >= MinLeaseTTL, "LeaseTTL must be at least %v, got %v", MinLeaseTTL, c.LeaseTTL)
	check(c.Retention > 0, "Retention must be positive, got %v", c.Retention)
	check(c.Retention <= 0 || c.Retention >= c.LeaseTTL, "Retention (%v) must be at least LeaseTTL (%v): a duplicate can arrive a lease TTL after the completion (the broker's redelivery delay), and must still find the key", c.Retention, c.LeaseTTL)
	check(c.LeaseTTL <= backends.MaxDuration, "LeaseTTL must be at most %v, got %v", backends.MaxDuration, c.LeaseTTL)
	check(c.Retention <= backends.MaxDuration, "Retention must be at most %v, got %v", backends.MaxDuration, c.Retention)
	c.Timing.validate(check)
	check(c.CompletedCache.Size >= 0, "CompletedCache.Size must not be negative, got %d", c.CompletedCache.Size)
	check(c.CompletedCache.TTL >= 0, "CompletedCache.TTL must not be negative, got %v", c.CompletedCache.TTL)
	check(c.CompletedCache.Size <= 0 || c.CompletedCache.TTL > 0, "CompletedCache.TTL must be positive when CompletedCache.Size is, got %v", c.CompletedCache.TTL)
	check(c.MaxConcurrentAcquires > 0, "MaxConcurrentAcquires must be positive, got %d", c.MaxConcurrentAcquires)
	check(c.MaxKeyBytes > 0, "MaxKeyBytes must be positive, got %d", c.MaxKeyBytes)
	check(c.MaxKeyBytes <= backends.MaxKeyBytes, "MaxKeyBytes must be at most %d (backends.MaxKeyBytes), got %d", backends.MaxKeyBytes, c.MaxKeyBytes)
	check(c.MaxKeyBytes > len(c.Namespace)+1, "MaxKeyBytes (%d) leaves no room for a key after Namespace %q", c.MaxKeyBytes, c.Namespace)
	check(c.MaxOutputBytes > 0, "MaxOutputBytes must be positive, got %d", c.MaxOutputBytes)
	if limit := storeOutputLimit(c.Store); limit > 0 {
		check(c.MaxOutputBytes <= limit, "MaxOutputBytes must be at most the store's limit %d (backends.OutputLimiter), got %d", limit, c.MaxOutputBytes)
	}
	check(c.OnKeyError == KeyErrorReject || c.OnKeyError == KeyErrorRunUnprotected, "OnKeyError: unknown policy %d", c.OnKeyError)
	check(c.OnFingerprintMismatch == MismatchReject || c.OnFingerprintMismatch == MismatchIgnore, "OnFingerprintMismatch: unknown policy %d", c.OnFingerprintMismatch)
	check(c.OnStoreError == StoreErrorReject || c.OnStoreError == StoreErrorRunUnprotected, "OnStoreError: unknown policy %d", c.OnStoreError)
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
}

// storeOutputLimit is the store's limit on a completion's output
// (backends.OutputLimiter), or 0 if it sets none.
func storeOutputLimit(store backends.Store) int {
	if ol, ok := store.(backends.OutputLimiter); ok && !isNil(store) {
		return ol.MaxOutputBytes()
	}
	return 0
}
