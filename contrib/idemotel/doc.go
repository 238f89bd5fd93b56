// Package idemotel reports the idempotency middleware to OpenTelemetry:
// metrics and span events for every delivery, and the latency of every
// store call.
//
//	import "github.com/watermill-idempotency/idempotency/contrib/idemotel"
//
// It depends on the OpenTelemetry API only: the application chooses the
// SDK and the exporter (Prometheus, OTLP, ...) and passes its providers,
// or sets the global ones. It requires go.opentelemetry.io/otel v1.47.0
// or later: that release needs Go 1.26, as the core module already does,
// so the older v1.46.0 (Go 1.25) would widen nothing.
//
// # Deliveries
//
// [NewObserver] returns a middleware.Observer; set it as
// middleware.Config.Observer (with middleware.MultiObserver to keep
// another one). It records, under the instrumentation scope [ScopeName]:
//
//   - watermill.idempotency.deliveries, a counter of deliveries by outcome,
//     acked, handler name and, when nacked, error.type;
//   - watermill.idempotency.handler.duration, how long the handler ran,
//     and watermill.idempotency.wait.duration, how long a duplicate waited
//     for the key's holder, histograms in seconds;
//   - watermill.idempotency.takeovers, leases taken over from a holder
//     that stopped renewing them, and watermill.idempotency.replayed.messages,
//     stored messages replayed for duplicates.
//
// A handler's series of the outcomes whose attributes are known in
// advance (processed, duplicate, processed_not_recorded, in_progress,
// lease_lost and the poison outcomes), its takeovers and its replayed
// messages start at zero at its first delivery, so that the first lost
// lease is an increase Prometheus's increase() sees, not a series born at
// 1. No metric carries a key or a message UUID. On the span active in the
// message's context (the consumer span a tracing middleware started
// outside this one), it adds one event per delivery with the outcome and
// the fencing token; it starts no span of its own and never sets the
// span's status.
//
// # Store calls
//
// [InstrumentStore] wraps any backends.Store and records
// watermill.idempotency.store.operation.duration by operation and
// error.type, and optionally a span per call.
//
// # Store state
//
// [NewGauges] reports, as observable gauges, the records of each named
// namespace by state, how long the oldest lease still in progress has
// been held (a stuck handler), and an outbox's backlog
// (contrib/sqloutbox). A goroutine of its own collects them every
// GaugesConfig.Interval, one collection at a time and each bounded by
// GaugesConfig.Timeout, so a slow store holds up no scrape; on Redis and
// DynamoDB each namespace's count scans the whole store, so it is opt-in
// and its cost is in docs/operations.md.
//
// # Replays
//
// A replayed duplicate's messages carry the metadata they were stored
// with. Set middleware.Config.ReplayDropMetadata to [PropagationKeys] so
// that they do not carry the first delivery's trace context.
package idemotel
