package middleware

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/watermill-idempotency/idempotency/backends"
)

// acquire calls Store.Acquire once it has a slot (see [guard]), retrying
// transient failures within Timing.StoreTimeout. A retry after an ambiguous
// failure (the store applied the call, the reply was lost) is safe because
// Acquire is re-entrant for the same owner. Errors retrying cannot fix
// return at once. It also returns when the successful call was sent, which
// starts the lease.
//
// A key in the completed-key cache (Config.CompletedCache) is answered
// from it, as the store would answer, with no store call; a completion the
// store reports is cached.
func (m *Idempotency) acquire(d *delivery) (backends.AcquireResult, time.Time, error) {
	if res, ok := m.cache.get(d.key); ok {
		return res, time.Now(), nil
	}
	if err := m.guard.enter(d.ctx); err != nil {
		return backends.AcquireResult{}, time.Time{}, fmt.Errorf("waiting for a store slot: %w", err)
	}
	defer m.guard.leave()
	ctx := withDeadline(d.base, m.cfg.Timing.StoreTimeout)
	defer ctx.stop()
	req := backends.AcquireRequest{Key: d.key, Owner: d.owner, LeaseTTL: m.cfg.LeaseTTL, Retention: m.cfg.Retention, Fingerprint: d.fp, Origin: d.origin}
	var last error
	for {
		t, err := m.guard.admit(ctx)
		if err != nil {
			return backends.AcquireResult{}, time.Time{}, errors.Join(last, err)
		}
		sent := time.Now()
		res, err := m.acquireOnce(ctx, t, req)
		if err == nil && res.Status == backends.StatusCompleted {
			// The record is kept for Retention after its completion, as
			// far as this process knows (another may use another).
			m.cache.put(d.key, res, res.CompletedAt.Add(m.cfg.Retention))
		}
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

// origin names a delivery for the store's record (AcquireRequest.Origin):
// "message_uuid=<uuid> handler=<name>", each value quoted when it holds a
// space, a quote or an equals sign, made valid UTF-8 without NUL and cut
// to backends.MaxOriginBytes.
func origin(uuid, handler string) string {
	o := "message_uuid=" + originValue(uuid)
	if handler != "" {
		o += " handler=" + originValue(handler)
	}
	return cutOrigin(o)
}

// cleanOrigin makes o valid UTF-8 without NUL, and cuts it to
// backends.MaxOriginBytes.
func cleanOrigin(o string) string {
	return cutOrigin(strings.ReplaceAll(strings.ToValidUTF8(o, "\uFFFD"), "\x00", ""))
}

// cutOrigin cuts o, valid UTF-8, to backends.MaxOriginBytes on a rune
// boundary.
func cutOrigin(o string) string {
	if len(o) > backends.MaxOriginBytes {
		o = o[:backends.MaxOriginBytes]
		for len(o) > 0 && !utf8.ValidString(o) {
			o = o[:len(o)-1] // a rune cut in two
		}
	}
	return o
}

func originValue(v string) string {
	v = strings.ReplaceAll(strings.ToValidUTF8(v, "\uFFFD"), "\x00", "")
	if v == "" || strings.ContainsAny(v, " \"=") {
		return strconv.Quote(v)
	}
	return v
}
