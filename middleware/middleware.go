package middleware

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Idempotency is the middleware. Create it with [New] and add its
// [Idempotency.Middleware] method to a router or a handler. It is safe for
// concurrent use and may be shared by several handlers: each gets its own
// key namespace (the handler name) unless Config.Namespace is set.
type Idempotency struct {
	cfg      Config
	guard    *guard
	repeats  *repeats
	logs     logLimit
	handlers topicHandlers
}

// New returns the middleware for cfg, or an error wrapping
// [ErrInvalidConfig] that lists every invalid field. cfg is not modified.
func New(cfg Config) (*Idempotency, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Idempotency{cfg: cfg, guard: newGuard(cfg.MaxConcurrentAcquires, cfg.MaxStoreBackoff), repeats: newRepeats(cfg.MaxStoreBackoff)}, nil
}

// Owner tokens are unique per delivery attempt: 64 random bits chosen once
// per process, then a counter. That is as unique as a random token per
// attempt and much cheaper.
var (
	ownerPrefix = func() string {
		b := make([]byte, 8)
		_, _ = crand.Read(b)
		return hex.EncodeToString(b) + "-"
	}()
	ownerSeq atomic.Uint64
)

func newOwner() string {
	var buf [40]byte
	b := append(buf[:0], ownerPrefix...)
	return string(strconv.AppendUint(b, ownerSeq.Add(1), 36))
}

type leaseCtxKey struct{}

// LeaseFromContext returns the lease the handler runs under. Inside a
// handler, call it with msg.Context(). Pass Lease.Token to the systems the
// handler writes to, so they can reject writes from a holder whose lease
// was taken over (fencing).
func LeaseFromContext(ctx context.Context) (backends.Lease, bool) {
	l, ok := ctx.Value(leaseCtxKey{}).(backends.Lease)
	return l, ok
}

// Middleware wraps h so that it runs at most once to completion per key.
// Its signature is message.HandlerMiddleware.
func (m *Idempotency) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return m.handle(msg, h)
	}
}

// delivery carries one message through the state machine.
type delivery struct {
	msg   *message.Message
	ctx   context.Context // msg's context, not cancelled by ack or nack
	key   string
	owner string
	fp    []byte
	ev    Event
}

func (m *Idempotency) handle(msg *message.Message, h message.HandlerFunc) ([]*message.Message, error) {
	d := &delivery{msg: msg, ctx: context.WithoutCancel(msg.Context())}
	d.ev.MessageUUID = msg.UUID
	d.ev.Handler = message.HandlerNameFromCtx(msg.Context())
	m.warnSharedTopic(msg, d.ev.Handler)

	key, err := m.key(msg, d.ev.Handler)
	if err != nil {
		if m.cfg.OnKeyError == KeyErrorProcess {
			d.ev.Err = err
			return m.runUnprotected(d, h)
		}
		return m.finish(d, OutcomeKeyError, nil, err)
	}
	d.key, d.ev.Key = key, key
	d.owner = newOwner()
	if m.cfg.Fingerprint != nil {
		d.fp = m.cfg.Fingerprint(msg)
		if len(d.fp) > backends.MaxFingerprintBytes {
			sum := sha256.Sum256(d.fp)
			d.fp = sum[:]
		}
	}

	res, sentAt, err := m.acquire(d)
	if err != nil && d.msg.Context().Err() != nil {
		// Cancelled (the router is closing) while waiting for a slot.
		return m.finish(d, OutcomeInProgress, nil, err)
	}
	if err != nil {
		err = fmt.Errorf("%w: acquire %q: %w", ErrStore, key, err)
		if m.cfg.FailOpen {
			d.ev.Err = err
			return m.runUnprotected(d, h)
		}
		return m.storeError(d, err)
	}
	if res.Status == backends.InProgress && !m.mismatch(d, res) {
		res, sentAt, err = m.waitForHolder(d, res)
		if err != nil && d.msg.Context().Err() != nil {
			// The delivery was cancelled (the router is closing) while the
			// key was still held elsewhere.
			return m.finish(d, OutcomeInProgress, nil, err)
		}
		if err != nil {
			return m.storeError(d, err)
		}
	}
	if m.mismatch(d, res) && m.cfg.OnFingerprintMismatch == MismatchReject {
		if res.Status == backends.Acquired {
			m.release(d, nil, res.Lease)
		}
		return m.finish(d, OutcomeFingerprintMismatch, nil, fmt.Errorf("%w: key %q", ErrFingerprintMismatch, key))
	}

	switch res.Status {
	case backends.Acquired:
		return m.run(d, h, res.Lease, sentAt)
	case backends.Completed:
		out, err := backends.DecodeOutput(res.Output)
		if err != nil {
			return m.storeError(d, fmt.Errorf("key %q: %w", key, err))
		}
		d.ev.Replayed = len(out)
		for _, r := range out {
			for _, k := range m.cfg.ReplayDropMetadata {
				delete(r.Metadata, k)
			}
		}
		return m.finish(d, OutcomeDuplicate, out, nil)
	default:
		return m.finish(d, OutcomeInProgress, nil, &InProgressError{Key: key, Remaining: res.Remaining, Waited: d.ev.Waited})
	}
}

// key returns msg's full key: the namespace (handler, the router's handler
// name, unless Config.Namespace is set), a colon, and the extracted key.
func (m *Idempotency) key(msg *message.Message, handler string) (string, error) {
	ns := m.cfg.Namespace
	if ns == "" {
		if ns = handler; ns == "" {
			return "", &KeyError{MessageUUID: msg.UUID, Err: ErrNoNamespace}
		}
	}
	k, err := m.cfg.Key.Key(msg)
	if err == nil && k == "" {
		err = errors.New("the extractor returned an empty key")
	}
	if err != nil {
		return "", &KeyError{MessageUUID: msg.UUID, Err: err}
	}
	full := ns + ":" + k
	if len(full) > m.cfg.MaxKeyBytes {
		return "", &KeyError{MessageUUID: msg.UUID, Err: fmt.Errorf("%w: %d bytes, the limit is %d", ErrKeyTooLong, len(full), m.cfg.MaxKeyBytes)}
	}
	return full, nil
}

func (m *Idempotency) mismatch(d *delivery, res backends.AcquireResult) bool {
	if d.fp == nil || res.Fingerprint == nil || bytes.Equal(d.fp, res.Fingerprint) {
		return false
	}
	d.ev.FingerprintMismatch = true
	return true
}

// acquire calls Store.Acquire once it has a slot (see [guard]), retrying
// transient failures within StoreTimeout. A retry after an ambiguous
// failure (the store applied the call, the reply was lost) is safe because
// Acquire is re-entrant for the same owner. Errors retrying cannot fix
// return at once. It also returns when the successful call was sent, which
// starts the lease.
func (m *Idempotency) acquire(d *delivery) (backends.AcquireResult, time.Time, error) {
	if err := m.guard.enter(d.msg.Context()); err != nil {
		return backends.AcquireResult{}, time.Time{}, fmt.Errorf("waiting for a store slot: %w", err)
	}
	defer m.guard.leave()
	ctx := withDeadline(d.ctx, m.cfg.StoreTimeout)
	defer ctx.stop()
	req := backends.AcquireRequest{Key: d.key, Owner: d.owner, LeaseTTL: m.cfg.LeaseTTL, Retention: m.cfg.Retention, Fingerprint: d.fp}
	var last error
	for {
		t, err := m.guard.admit(ctx)
		if err != nil {
			return backends.AcquireResult{}, time.Time{}, errors.Join(last, err)
		}
		sent := time.Now()
		res, err := m.acquireOnce(ctx, t, req)
		if !retryable(err) {
			return res, sent, err
		}
		if ctx.Err() != nil {
			return res, sent, errors.Join(err, ctx.Err())
		}
		last = err
	}
}

// acquireOnce makes one Acquire call admitted by the guard and records its
// result; a probe's result even if the store panics, or no probe would
// ever be sent again.
func (m *Idempotency) acquireOnce(ctx context.Context, t ticket, req backends.AcquireRequest) (res backends.AcquireResult, err error) {
	if t.probe {
		defer func() { m.guard.record(t, err) }()
		return m.cfg.Store.Acquire(ctx, req)
	}
	res, err = m.cfg.Store.Acquire(ctx, req)
	m.guard.record(t, err)
	return res, err
}

// waitForHolder polls the store, with backoff, until the holder of the key
// completes or gives it up, or the wait ends. It never acks: the caller
// turns a result still in progress into a nack. A store that can wake
// waiters (backends.Watcher) is watched instead: the store is asked again
// when the watch fires, when the holder's lease runs out, and otherwise
// only every watchedPollFactor × MaxPollInterval, as a safety net. While
// the store cannot watch (its subscription lost and not yet back), the
// wait polls with backoff and tries to watch again after each poll that
// finds the key still in progress, so that it is woken again once the
// store can watch.
func (m *Idempotency) waitForHolder(d *delivery, res backends.AcquireResult) (backends.AcquireResult, time.Time, error) {
	budget := m.cfg.InProgressWait
	if budget == 0 {
		budget = min(res.Remaining+m.cfg.PollInterval, m.cfg.LeaseTTL)
	}
	start := time.Now()
	deadline := start.Add(budget)
	interval := m.cfg.PollInterval
	var sentAt time.Time
	defer func() { d.ev.Waited = time.Since(start) }()
	w := &waiter{m: m, d: d, end: func() {}}
	defer w.stop()
	w.rewatch()
	var lastAsk time.Time
	for wakes := 0; res.Status == backends.InProgress; {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		// Sleep for the backoff interval with ±20% jitter, or while
		// watched for the safety interval, but wake when the holder's
		// lease runs out or the store says the key changed, and never
		// past the deadline. A change before the watch was in place
		// needs no look of its own: the store wakes a watch at once if
		// the key is no longer held when it is placed
		// (backends.Watcher).
		pause := jitter(interval)
		if w.watching() {
			pause = jitter(watchedPollFactor * m.cfg.MaxPollInterval)
		}
		pause = min(pause, res.Remaining+time.Millisecond, left)
		timer := time.NewTimer(pause)
		select {
		case <-d.msg.Context().Done():
			timer.Stop()
			return res, sentAt, fmt.Errorf("waiting for key %q: %w", d.key, d.msg.Context().Err())
		case <-timer.C:
		case <-w.changed:
			timer.Stop()
			wakes++
			if wakes == 1 {
				// Most likely the holder finished: ask the store at once,
				// and watch again only if the key is still in progress.
				w.changed = nil
				break
			}
			// Later wakes (a new holder, a lost subscription, a store
			// that wakes without cause) watch again first, so that the
			// ask covers any change until the new watch is in place, and
			// ask no sooner than the poll backoff allows.
			w.rewatch()
			if wait := time.Until(lastAsk.Add(interval)); wait > 0 {
				sleepCtx(d.msg.Context(), min(wait, time.Until(deadline)))
				if err := d.msg.Context().Err(); err != nil {
					return res, sentAt, fmt.Errorf("waiting for key %q: %w", d.key, err)
				}
			}
		}
		interval = min(interval*2, m.cfg.MaxPollInterval)

		var err error
		lastAsk = time.Now()
		res, sentAt, err = m.acquire(d)
		if err != nil {
			return res, sentAt, fmt.Errorf("%w: acquire %q while waiting: %w", ErrStore, d.key, err)
		}
		if m.mismatch(d, res) {
			return res, sentAt, nil
		}
		// Not watching: after the first wake above, or because the store
		// could not watch when last asked. Try again: the stores here
		// report not ok at once, without a round trip, while they cannot
		// watch, so trying costs nothing then, and the polling ends as
		// soon as they can watch again.
		if !w.watching() && res.Status == backends.InProgress {
			w.rewatch()
		}
	}
	// The wait ends on what the store says after its deadline. On a
	// starved machine the last look can be from well before it (the
	// first, even, from before the wait began), and the holder may have
	// finished, failed or run out of lease since.
	if res.Status == backends.InProgress && budget > 0 && lastAsk.Before(deadline) {
		var err error
		res, sentAt, err = m.acquire(d)
		if err != nil {
			return res, sentAt, fmt.Errorf("%w: acquire %q while waiting: %w", ErrStore, d.key, err)
		}
	}
	return res, sentAt, nil
}

// watchedPollFactor × MaxPollInterval is the pause between two safety
// looks at the store while a Watcher watches the key.
const watchedPollFactor = 10

// waiter is a waiting duplicate's watch on its key, if the store can
// wake it (backends.Watcher). changed is nil while nothing is watched.
type waiter struct {
	m       *Idempotency
	d       *delivery
	changed <-chan struct{}
	end     func()
}

// rewatch starts a new watch, waiting at most StoreTimeout for it to be
// in place, and then ends the current one, if any: a store that keeps a
// subscription per key keeps it across the two.
func (w *waiter) rewatch() {
	old := w.end
	defer old()
	w.changed, w.end = nil, func() {}
	watcher, ok := w.m.cfg.Store.(backends.Watcher)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(w.d.msg.Context(), w.m.cfg.StoreTimeout)
	defer cancel()
	changed, end, ok := watcher.Watch(ctx, w.d.key)
	w.end = end
	if ok {
		w.changed = changed
	}
}

func (w *waiter) watching() bool { return w.changed != nil }

func (w *waiter) stop() { w.end() }

// run runs the handler under the lease and settles the key afterwards.
func (m *Idempotency) run(d *delivery, h message.HandlerFunc, lease backends.Lease, sentAt time.Time) ([]*message.Message, error) {
	d.ev.Lease = lease
	orig := d.msg.Context()
	hctx, cancel := context.WithCancelCause(context.WithValue(orig, leaseCtxKey{}, lease))
	k := startKeeper(d.ctx, m.cfg.Store, lease, m.cfg.LeaseTTL, m.cfg.StoreTimeout, sentAt, cancel)
	d.msg.SetContext(hctx)

	start := time.Now()
	panicked := true
	defer func() {
		d.msg.SetContext(orig)
		cancel(nil)
		if panicked {
			// Let the redelivery run: give the lease up, then let the
			// panic go on to the router (or a Recoverer middleware).
			if k.err() == nil {
				m.release(d, k, lease)
			}
			k.stop()
			d.ev.HandlerDuration = time.Since(start)
			m.finish(d, OutcomeHandlerFailed, nil, errors.New("handler panicked"))
		}
	}()
	out, err := h(d.msg)
	panicked = false
	d.ev.HandlerDuration = time.Since(start)

	if lost := k.err(); lost != nil {
		k.stop()
		if err == nil && m.completedUnder(d, lease) {
			// The handler completed the key in its own transaction; a
			// renewal that waited on that transaction's row lock then found
			// the key completed, not lost.
			d.ev.CompletedByHandler = true
			return m.finish(d, OutcomeProcessed, out, nil)
		}
		// Someone else may hold the key now: never ack, never publish.
		return m.finish(d, OutcomeLeaseLost, nil, errors.Join(lost, err))
	}
	if err != nil {
		m.release(d, k, lease)
		return m.finish(d, OutcomeHandlerFailed, nil, err)
	}
	encoded := backends.EncodeOutput(out)
	if len(encoded) > m.cfg.MaxOutputBytes {
		m.release(d, k, lease)
		return m.finish(d, OutcomeOutputTooLarge, nil, fmt.Errorf("%w: %d messages encode to %d bytes, the limit is %d",
			ErrOutputTooLarge, len(out), len(encoded), m.cfg.MaxOutputBytes))
	}
	attempts, cerr := m.settle(d, k, func(ctx context.Context) error {
		return m.cfg.Store.Complete(ctx, lease, encoded)
	})
	lost := k.stop()
	switch {
	case cerr == nil:
		return m.finish(d, OutcomeProcessed, out, nil)
	case m.completedUnder(d, lease):
		// The handler completed the key itself, in the transaction that
		// holds its own writes (pgstore.Store.CompleteTx), if the very
		// first attempt found it so; otherwise an earlier attempt was
		// applied and its reply lost.
		d.ev.CompletedByHandler = attempts == 1 && errors.Is(cerr, backends.ErrLeaseLost)
		return m.finish(d, OutcomeProcessed, out, nil)
	case errors.Is(cerr, backends.ErrLeaseLost), errors.Is(lost, backends.ErrLeaseLost) && !errors.Is(lost, errNotRenewed):
		// The store says another owner holds the key, or deleted it.
		return m.finish(d, OutcomeLeaseLost, nil, fmt.Errorf("idempotency: at completion: %w", errors.Join(cerr, lost)))
	}
	// The last resort: the work is done, but its completion could not be
	// recorded while the lease could still be kept. Nacking would run the
	// handler again for certain; acking lets a duplicate run it again only
	// if one arrives after the lease has run out.
	d.ev.Err = fmt.Errorf("%w: complete %q: %w", ErrStore, d.key, errors.Join(cerr, lost))
	m.finish(d, OutcomeProcessedNotRecorded, nil, nil)
	return out, nil
}

// settle runs op (a Complete or Release of the lease) until it succeeds or
// fails for good, retrying transient failures with jittered backoff while
// the keeper still holds the lease, and for at most a lease TTL (or
// StoreTimeout if longer) in all. Each attempt is bounded by StoreTimeout.
// The keeper keeps renewing meanwhile, so a slow or briefly unreachable
// store delays the settlement instead of letting the lease run out under
// finished work. It returns the number of attempts and op's last error.
func (m *Idempotency) settle(d *delivery, k *keeper, op func(ctx context.Context) error) (attempts int, err error) {
	limit := time.Now().Add(max(m.cfg.LeaseTTL, m.cfg.StoreTimeout))
	wait := backoffBase
	for {
		ctx := withDeadline(d.ctx, m.cfg.StoreTimeout)
		err = op(ctx)
		ctx.stop()
		attempts++
		if !retryable(err) || errors.Is(err, backends.ErrLeaseLost) {
			return attempts, err
		}
		pause := jitter(wait)
		if time.Until(limit) < pause {
			return attempts, err
		}
		var lostCh <-chan struct{} // nil, never ready, without a keeper
		if k != nil {
			lostCh = k.done()
		}
		t := time.NewTimer(pause)
		select {
		case <-lostCh:
			t.Stop()
			return attempts, err
		case <-t.C:
		}
		wait = min(wait*2, m.cfg.MaxStoreBackoff, max(m.cfg.LeaseTTL/10, backoffBase))
	}
}

// completedUnder reports whether the key was completed under lease: by the
// same owner with the same fencing token, so by this very attempt. It
// retries transient failures within StoreTimeout: its answer decides
// between an ack and a nack.
func (m *Idempotency) completedUnder(d *delivery, lease backends.Lease) bool {
	ctx := withDeadline(d.ctx, m.cfg.StoreTimeout)
	defer ctx.stop()
	for wait := backoffBase; ; wait = min(wait*2, m.cfg.MaxStoreBackoff) {
		rec, err := m.cfg.Store.Inspect(ctx, lease.Key)
		if !retryable(err) || errors.Is(err, backends.ErrNotFound) {
			return err == nil && rec.State == backends.StateCompleted && rec.Owner == lease.Owner && rec.Token == lease.Token
		}
		if dl, _ := ctx.Deadline(); time.Until(dl) < wait {
			return false
		}
		sleepCtx(ctx, jitter(wait))
	}
}

// runUnprotected runs the handler without a lease (FailOpen, KeyErrorProcess).
func (m *Idempotency) runUnprotected(d *delivery, h message.HandlerFunc) ([]*message.Message, error) {
	start := time.Now()
	out, err := h(d.msg)
	d.ev.HandlerDuration = time.Since(start)
	if err != nil {
		d.ev.Err = errors.Join(d.ev.Err, err)
		d.ev.handlerFailed = true
	}
	m.finish(d, OutcomeUnprotected, nil, nil)
	return out, err
}

// release gives the lease up after a failure, so the redelivery can take
// the key at once, retrying while the keeper holds the lease (see settle),
// then stops the keeper (k may be nil: the lease was never kept). If it
// still fails, the failure is logged: the lease then runs out by itself
// within LeaseTTL.
func (m *Idempotency) release(d *delivery, k *keeper, lease backends.Lease) {
	_, err := m.settle(d, k, func(ctx context.Context) error { return m.cfg.Store.Release(ctx, lease) })
	if k != nil {
		k.stop()
	}
	if err != nil && !errors.Is(err, backends.ErrLeaseLost) {
		m.cfg.Logger.Error("idempotency: release failed; the lease will run out by itself", err, m.fields(d))
	}
}

// storeError reports a delivery that failed on the store, after a pause
// (see guard.pause) so that a broker that redelivers a nack at once does
// not turn a store outage into a storm of calls. The pause ends early if
// the delivery is cancelled.
func (m *Idempotency) storeError(d *delivery, err error) ([]*message.Message, error) {
	sleepCtx(d.msg.Context(), m.guard.pause())
	return m.finish(d, OutcomeStoreError, nil, err)
}

// finish reports the outcome and returns what the handler should return.
// When err is nil, a non-nil d.ev.Err is kept as the event's error.
func (m *Idempotency) finish(d *delivery, o Outcome, out []*message.Message, err error) ([]*message.Message, error) {
	d.ev.Outcome = o
	if err != nil {
		d.ev.Err = err
	}
	m.log(d)
	if m.cfg.Observer != nil {
		m.cfg.Observer.Observe(d.ctx, d.ev)
	}
	if err != nil && IsPoison(err) {
		// It will fail the same way when it comes back: do not let a
		// broker that redelivers at once spin on it (pace.go).
		sleepCtx(d.msg.Context(), m.repeats.failed(d.ev.MessageUUID, time.Now()))
	}
	return out, err
}

func (m *Idempotency) fields(d *delivery) watermill.LogFields {
	f := make(watermill.LogFields, 6)
	f["idempotency_key"], f["message_uuid"] = d.key, d.ev.MessageUUID
	if d.ev.Outcome != 0 {
		f["outcome"] = d.ev.Outcome.String()
	}
	if d.ev.Lease.Token != 0 {
		f["fencing_token"] = d.ev.Lease.Token
		f["attempt"] = d.ev.Lease.Attempt
	}
	if d.ev.Waited > 0 {
		f["waited"] = d.ev.Waited
	}
	return f
}

func (m *Idempotency) log(d *delivery) {
	if _, nop := m.cfg.Logger.(watermill.NopLogger); nop {
		return // spare building the fields
	}
	f := m.fields(d)
	switch o := d.ev.Outcome; o {
	case OutcomeProcessed, OutcomeHandlerFailed:
		// Routine; the router logs handler errors itself.
		m.cfg.Logger.Trace("idempotency: "+o.String(), f)
	case OutcomeDuplicate, OutcomeInProgress:
		m.cfg.Logger.Debug("idempotency: "+o.String(), f)
	default:
		if m.logs.allow(o, time.Now(), f) {
			m.cfg.Logger.Error("idempotency: "+o.String(), d.ev.Err, f)
		}
	}
}
