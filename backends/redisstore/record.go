package redisstore

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// A record is one Redis string (acquire.lua describes the layout):
//
//	state token ':' owner '\0' attempt ':' retention ':' acquired ':' origin '\0' len(fp) ':' fp [seconds ':' microseconds ':' output]
//
// The client writes a lease's record itself: a fresh key's with one SET
// NX PX GET, and, from the record that answered, a released or expired
// key's or its own (take.lua compares and sets). The scripts cut a record
// at its separators and join the pieces, so no script converts a number
// on the common path. acquired is a time (ms since the epoch), empty
// (unknown: a lease taken over from a 0.1.0 record), or, until the key's
// expiry first moves, '~' and the lease's TTL: the key's expiry less the
// retention less that TTL. A completion's time is the completing
// process's clock.
const (
	statePending   = 'p'
	stateReleased  = 'r'
	stateCompleted = 'c'
)

// record is a decoded record.
type record struct {
	state     byte
	token     int64
	owner     string
	attempt   int
	retention int64 // ms
	// acquired is when the lease was acquired, ms since the epoch (0 if
	// unknown); if acquiredTTL is set instead, the lease's TTL, ms, and
	// the acquisition was the key's expiry less the retention less that.
	acquired, acquiredTTL int64
	origin                string
	fingerprint           []byte
	completedAt           time.Time // completed only
	output                []byte    // completed only
	headerOnly            bool      // decoded from a prefix: no origin, fingerprint or output
}

// errNotRecord is the error of a string that is not a record.
var errNotRecord = errors.New("the key holds a string that is not a record of this store")

// leaseRecord is the record of a lease: acquired is ms since the epoch,
// or, if 0, '~' and the lease's TTL (ms), for SET PX of the TTL +
// retention, or, with a zero TTL too, unknown.
func leaseRecord(token int64, owner string, attempt int, retention, ttl, acquired int64, origin string, fp []byte) string {
	var b strings.Builder
	b.Grow(len(owner) + len(origin) + len(fp) + 64)
	var num [20]byte
	b.WriteByte(statePending)
	b.Write(strconv.AppendInt(num[:0], token, 10))
	b.WriteByte(':')
	b.WriteString(owner)
	b.WriteByte(0)
	b.Write(strconv.AppendInt(num[:0], int64(attempt), 10))
	b.WriteByte(':')
	b.Write(strconv.AppendInt(num[:0], retention, 10))
	b.WriteByte(':')
	switch {
	case acquired != 0:
		b.Write(strconv.AppendInt(num[:0], acquired, 10))
	case ttl != 0:
		b.WriteByte('~')
		b.Write(strconv.AppendInt(num[:0], ttl, 10))
	}
	b.WriteByte(':')
	b.WriteString(origin)
	b.WriteByte(0)
	b.Write(strconv.AppendInt(num[:0], int64(len(fp)), 10))
	b.WriteByte(':')
	b.Write(fp)
	return b.String()
}

// completion is the time of a completion at t as a completed record
// keeps it, seconds ':' microseconds ':', before the output.
func completion(t time.Time) string {
	var b [48]byte
	s := strconv.AppendInt(b[:0], t.Unix(), 10)
	s = append(s, ':')
	s = strconv.AppendInt(s, int64(t.Nanosecond()/1000), 10)
	return string(append(s, ':'))
}

// acquiredAt is when the lease of the record was acquired, for a key that
// expires at at (ms since the epoch, -1 for never); zero if unknown.
func (r record) acquiredAt(at int64) time.Time {
	switch {
	case r.acquiredTTL > 0 && at >= 0:
		return time.UnixMilli(at - r.retention - r.acquiredTTL)
	case r.acquired > 0:
		return time.UnixMilli(r.acquired)
	}
	return time.Time{}
}

// leaseHeader is the start of the record of the lease l holds: what
// lease.lua compares the record with.
func leaseHeader(l backends.Lease) string {
	return "p" + strconv.FormatInt(l.Token, 10) + ":" + l.Owner + "\x00"
}

// decodeRecord decodes v. With headerOnly, v may be cut anywhere after
// the acquired field (list.go reads records' first bytes only).
func decodeRecord(v string, headerOnly bool) (record, error) {
	var r record
	if len(v) < 2 {
		return r, errNotRecord
	}
	r.state = v[0]
	if r.state != statePending && r.state != stateReleased && r.state != stateCompleted {
		return r, errNotRecord
	}
	rest := v[1:]
	next := func(sep byte) (string, bool) {
		i := strings.IndexByte(rest, sep)
		if i < 0 {
			return "", false
		}
		s := rest[:i]
		rest = rest[i+1:]
		return s, true
	}
	num := func(sep byte) (int64, bool) {
		s, ok := next(sep)
		if !ok {
			return 0, false
		}
		n, err := strconv.ParseInt(s, 10, 64)
		return n, err == nil
	}
	var ok bool
	if r.token, ok = num(':'); !ok {
		return r, errNotRecord
	}
	if r.owner, ok = next(0); !ok {
		return r, errNotRecord
	}
	attempt, ok := num(':')
	if !ok {
		return r, errNotRecord
	}
	r.attempt = int(attempt)
	if r.retention, ok = num(':'); !ok {
		return r, errNotRecord
	}
	acquired, ok := next(':')
	if !ok {
		return r, errNotRecord
	}
	if a, rel := strings.CutPrefix(acquired, "~"); rel {
		r.acquiredTTL, _ = strconv.ParseInt(a, 10, 64)
		if r.acquiredTTL <= 0 {
			return r, errNotRecord
		}
	} else if acquired != "" {
		var err error
		if r.acquired, err = strconv.ParseInt(acquired, 10, 64); err != nil {
			return r, errNotRecord
		}
	}
	if headerOnly {
		r.headerOnly = true
		return r, nil
	}
	if r.origin, ok = next(0); !ok {
		return r, errNotRecord
	}
	fpLen, ok := num(':')
	if !ok || fpLen < 0 || fpLen > int64(len(rest)) {
		return r, errNotRecord
	}
	if fpLen > 0 {
		r.fingerprint = []byte(rest[:fpLen])
	}
	rest = rest[fpLen:]
	if r.state != stateCompleted {
		if rest != "" {
			return r, errNotRecord
		}
		return r, nil
	}
	sec, ok := num(':')
	if !ok {
		return r, errNotRecord
	}
	usec, ok := num(':')
	if !ok {
		return r, errNotRecord
	}
	r.completedAt = time.Unix(sec, usec*1000)
	if rest != "" {
		r.output = []byte(rest)
	}
	return r, nil
}

// lease is the lease a record of state p holds on key.
func (r record) lease(key string) backends.Lease {
	return backends.Lease{Key: key, Owner: r.owner, Token: r.token, Attempt: r.attempt}
}
