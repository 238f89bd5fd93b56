// Package keyfunc extracts idempotency keys, and payload fingerprints,
// from Watermill messages.
//
// An [Extractor] returns the key that identifies a message's unit of work:
// two deliveries with the same key are the same work, and the middleware
// runs the handler for it once. Pick the key by where duplicates come from:
//
//   - [UUID]: the broker redelivers the same message (lost acks, visibility
//     timeouts, consumer-group claims). The producer must keep the UUID
//     when it retries.
//   - [Metadata] or [JSONField]: producers may send the same business event
//     twice under new message UUIDs (an order id, a payment id, an
//     Idempotency-Key header).
//   - [PayloadHash]: identical payloads are the same work.
//   - [First], [Composite], [Hashed] and [Func] combine these or bring your own.
//
// # Fingerprints
//
// The middleware's Config.Fingerprint takes an extractor too: what it
// extracts identifies the content of the work, so that a key reused for a
// different payload is refused instead of dropped as a duplicate.
// [PayloadHash] fingerprints the whole payload; [JSONField] or [Composite]
// the fields that must agree.
//
// # Errors
//
// A message without a usable key gets an error wrapping one of the
// sentinel errors below, never an empty key: [ErrNoKey] (the UUID, the
// metadata field or the JSON field is missing or empty),
// [ErrMalformedPayload] (the payload is not valid JSON) or
// [ErrUnsupportedValue] (the JSON field is an object, array, boolean or
// null). The middleware passes these on so they can be routed to a poison
// queue.
//
// # Long keys
//
// Extractors return keys as they find them; the middleware rejects a key
// longer than its configured limit. Wrap an extractor whose keys may be long
// (a free-text field, say) in [Hashed] to get a fixed 64-character key.
package keyfunc
