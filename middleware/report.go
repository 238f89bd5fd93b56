package middleware

import (
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// storeError reports a delivery that failed on the store. A broker
// delivery returns after a pause (see guard.pause), so that a broker that
// redelivers a nack at once does not turn a store outage into a storm of
// calls; the pause ends early if the delivery is cancelled.
func (m *Idempotency) storeError(d *delivery, err error) error {
	if d.paced {
		sleep(d.ctx, m.guard.pause(), nil)
	}
	return m.finish(d, OutcomeStoreError, err)
}

// finish reports the outcome and returns the error for the caller. When
// err is nil, a non-nil d.ev.Err is kept as the event's error.
func (m *Idempotency) finish(d *delivery, o Outcome, err error) error {
	d.ev.Outcome = o
	if err != nil {
		d.ev.Err = err
	}
	m.log(d)
	if m.cfg.Observer != nil {
		m.cfg.Observer.Observe(d.base, d.ev)
	}
	if d.paced && err != nil && IsPoison(err) {
		// It will fail the same way when it comes back: do not let a
		// broker that redelivers at once spin on it (poison.go).
		sleep(d.ctx, m.repeats.failed(d.ev.MessageUUID, time.Now()), nil)
	}
	return err
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
	case OutcomeDuplicate, OutcomeInProgress, OutcomeCanceled:
		m.cfg.Logger.Debug("idempotency: "+o.String(), f)
	case OutcomeFingerprintMismatch:
		if !d.paced {
			// A call's or a request's own input: Do returns the error and
			// httpidem answers 422, as they answer a duplicate or a key in
			// progress. Only a broker's message is the service's to fix.
			f["err"] = d.ev.Err
			m.cfg.Logger.Debug("idempotency: "+o.String(), f)
			return
		}
		fallthrough
	default:
		if m.logs.allow(o, time.Now(), d.ev.Err, f) {
			m.cfg.Logger.Error("idempotency: "+o.String(), d.ev.Err, f)
		}
	}
}

// logLimit lets through at most one error line per outcome per second.
// The lines it leaves out are not lost: when the second ends, the last of
// them is logged with the count of the others as suppressed_since_last,
// so that a burst of failures is reported within a second of its first
// line even if nothing follows, and a flood (a store down, a stream of
// messages without a key) logs one line a second. Every delivery is
// accounted for: the lines logged plus their suppressed_since_last.
type logLimit struct {
	logger watermill.LoggerAdapter

	mu    sync.Mutex
	state [numOutcomes + 1]struct {
		last time.Time
		// suppressed counts the lines left out since last, the newest kept
		// as err and fields; while it is above zero, a flush is scheduled.
		suppressed int
		err        error
		fields     watermill.LogFields
	}
}

const logInterval = time.Second

// allow reports whether a line for outcome o may be logged now. If not,
// it keeps the line (err and f) and makes sure it is logged, with the
// count of the others left out, when the interval ends.
func (l *logLimit) allow(o Outcome, now time.Time, err error, f watermill.LogFields) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := &l.state[o]
	if !st.last.IsZero() && now.Sub(st.last) < logInterval {
		st.suppressed++
		st.err, st.fields = err, f
		if st.suppressed == 1 {
			time.AfterFunc(st.last.Add(logInterval).Sub(now), func() { l.flush(o) })
		}
		return false
	}
	st.last = now
	return true
}

// flush logs the newest line left out for o with the count of the
// others.
func (l *logLimit) flush(o Outcome) {
	l.mu.Lock()
	st := &l.state[o]
	n, err, f := st.suppressed, st.err, st.fields
	st.suppressed, st.err, st.fields = 0, nil, nil
	st.last = time.Now()
	l.mu.Unlock()
	if n > 1 {
		f["suppressed_since_last"] = n - 1
	}
	l.logger.Error("idempotency: "+o.String(), err, f)
}
