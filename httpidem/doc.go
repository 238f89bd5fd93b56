// Package httpidem is a net/http middleware for the Idempotency-Key
// header (draft-ietf-httpapi-idempotency-key-header-07), with the
// guarantees the idempotency middleware gives a Watermill handler, on the
// same stores and the same engine (idempotency.Do): a request with a key
// runs its handler at most once to completion per key, under a renewed,
// fenced lease; a retry of a completed request gets the stored response;
// a retry while the original runs gets 409 Conflict, or waits for it.
//
//	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "orders-api"})
//	...
//	keys, err := httpidem.New(httpidem.Config{Idempotency: idem, Required: true})
//	...
//	mux.Handle("POST /orders", keys.Handler(http.HandlerFunc(createOrder)))
//
// Handler has the shape of the middleware of chi, gorilla/mux and most
// routers (func(http.Handler) http.Handler); echo and gin wrap it with
// their adapters of net/http middleware.
//
// # What a request gets
//
// The key is the header's value, a Structured Field String
// ("8e03978e-40d5-43e8-bc93-6894a57f9324", quoted) or, leniently, a bare
// token. It is scoped by the route (the ServeMux pattern that matched, or
// the method and path), and by Config.Scope (a tenant, an account), so
// that the same key on another route or for another client is another
// key.
//
//   - No key: 400 Bad Request if Config.Required, else the handler runs
//     unprotected.
//   - An invalid key (more than one header, not a string, longer than
//     Config.MaxKeyBytes): 400 Bad Request.
//   - A new key: the handler runs under a lease, renewed while it runs;
//     its fencing token is in the request's context
//     (idempotency.LeaseFromContext). Its response is kept and sent when
//     it returns. A status that Config.Stored accepts (1xx–4xx but 408,
//     409, 425 and 429, by default) completes the key with the response:
//     the status, the headers on Config.ReplayHeaders and the body. Any
//     other (a 5xx) releases the key, so that a retry runs again.
//   - A completed key: the stored response, with Idempotent-Replayed: true.
//   - The same key with another request (method, path and query, body,
//     or Config.Fingerprint): 422 Unprocessable Content.
//   - A key whose original request still runs: 409 Conflict with
//     Retry-After (the original's remaining lease, in seconds), or, with
//     Config.InProgress set to Wait, the original's response once it
//     completes.
//   - The store fails, or the request's lease is lost while its handler
//     runs: 503 Service Unavailable with Retry-After.
//   - The key holds something that is not a response (completed by Do or
//     a Watermill handler in the same namespace): 500 Internal Server
//     Error.
//
// The middleware's own refusals have application/problem+json bodies (RFC
// 9457). The expiry policy the draft asks servers to publish is the
// Idempotency's Retention: a key is remembered that long after its
// completion (24 hours by default); say so in your API's documentation.
//
// # Limits
//
// The request body is read before the handler runs (to fingerprint it),
// up to Config.MaxRequestBytes (413 Content Too Large beyond). The
// response is kept in memory until the handler returns, so a streamed
// response reaches the client at the end (Flush does nothing until then);
// one whose body grows past Config.MaxResponseBytes is streamed from then
// on, not stored, and its key released. A handler cannot take over its
// connection: http.ResponseController's Hijack returns an error matching
// http.ErrNotSupported. Its deadlines apply to the client's connection.
//
// # In the handler's own transaction
//
// A handler that writes rows in a database transaction can complete its
// key in that transaction (contrib/sqloutbox's WithTx, or the stores'
// CompleteTxOutput with idempotency.CompletionOutput): the key is then
// stored with the response written so far, so write the response before
// the transaction commits, and discard it with [Reset] if the transaction
// fails.
//
// docs/http.md has the draft's rules and how each is met, and where Stripe's
// semantics differ.
package httpidem
