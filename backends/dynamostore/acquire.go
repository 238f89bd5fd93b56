package dynamostore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// A way to take the lease, each one conditional write whose condition is
// exactly the case it serves. DynamoDB's update expressions cannot choose
// between values, so each case that sets different values is its own
// write; Acquire tries the likeliest, and when its condition fails it
// learns the record from the failure and tries the case that record is in.
type way int

const (
	// fresh: no record, or one past its retention. A new record whose
	// fencing token still counts up from the old one's.
	fresh way = iota
	// afterRelease: a released record.
	afterRelease
	// takeover: another owner's expired lease.
	takeover
	// reentrant: the caller's own lease, extended.
	reentrant
)

const (
	// common sets a new lease's owner and times.
	common = `#state = :one, #owner = :owner, #acquired = :now, #lease = :lease, #retention = :retention, #forget = :forget, #ttl = :ttl, #ttl_after = :ttl_after`
	// next counts an acquisition of a live record.
	next = `, #token = #token + :one, #attempt = #attempt + :one`
	// adoptFP keeps a record's fingerprint, or adopts the request's.
	adoptFP = `, #fp = if_not_exists(#fp, :fp)`
)

// write is the UpdateItem of way w; fp and origin tell whether the
// request has a fingerprint and an origin. The expressions are built once.
func (w way) write(fp, origin bool) (set, cond string) {
	e := writes[w][b2i(fp)][b2i(origin)]
	return e.set, e.cond
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// writes holds the UpdateItem of each way, with and without a
// fingerprint, with and without an origin.
var writes = func() (out [reentrant + 1][2][2]struct{ set, cond string }) {
	for w := fresh; w <= reentrant; w++ {
		for fp := range 2 {
			for origin := range 2 {
				e := &out[w][fp][origin]
				e.set, e.cond = w.build(fp == 1, origin == 1)
			}
		}
	}
	return out
}()

// build makes the UpdateItem of way w. A new lease gets the request's
// origin (or none) and acquisition time (common); the owner's own keeps
// those it had.
func (w way) build(fp, origin bool) (set, cond string) {
	var remove []string
	originSet := ""
	if w != reentrant {
		if origin {
			originSet = `, #origin = :origin`
		} else {
			remove = append(remove, `#origin`)
		}
	}
	switch w {
	case fresh:
		set = `SET ` + common + `, #token = if_not_exists(#token, :zero) + :one, #attempt = :one` + originSet
		cond = `attribute_not_exists(#id) OR #forget <= :old`
		remove = append(remove, `#output`, `#completed`)
		if fp {
			set += `, #fp = :fp`
		} else {
			remove = append(remove, `#fp`)
		}
		fp = false // set, not adopted
	case afterRelease:
		set, cond = `SET `+common+next+originSet, `#forget > :old AND #state = :two`
	case takeover:
		set, cond = `SET `+common+next+originSet, `#forget > :old AND #state = :one AND #lease <= :old AND #owner <> :owner`
	case reentrant:
		set, cond = `SET #lease = :lease, #retention = :retention, #forget = :forget, #ttl = :ttl, #ttl_after = :ttl_after`,
			`#forget > :old AND #state = :one AND #owner = :owner`
	}
	if fp {
		set += adoptFP
	}
	if len(remove) > 0 {
		set += ` REMOVE ` + strings.Join(remove, `, `)
	}
	return set, cond
}

// maxRounds bounds the writes of one Acquire. Each failed write after the
// first means the record changed between the read that chose it and the
// write: another caller took the key, and released it or walked away,
// within one round trip. Running out takes a key under a write storm; the
// caller retries the error as transient.
const maxRounds = 16

// contentionPause is how long Acquire waits before its round-th write
// (from 0) once the record changed under an informed write: nothing before
// the first two (a guess, then the case it showed), then up to 2, 4, 8 ...
// 128 ms, at random, so that writers racing for a free record stop meeting
// in step.
func contentionPause(round int) time.Duration {
	if round < 2 {
		return 0
	}
	ceiling := time.Millisecond << min(round-1, 7)
	return rand.N(ceiling)
}

// Acquire implements [backends.Store]: one conditional write for a new
// key or a duplicate; two for a takeover, an acquisition after a release
// or a re-entrant one, the first failing and showing the case. A server
// that returns no item with a failed condition costs a read after each
// failure. See the package documentation.
func (s *Store) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	if err := storekit.ValidateAcquire(req); err != nil {
		return backends.AcquireResult{}, err
	}
	w := fresh
	for round := range maxRounds {
		if d := contentionPause(round); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return backends.AcquireResult{}, opError("acquire", ctx.Err())
			case <-t.C:
			}
		}
		now := s.now().UnixMilli()
		lease := now + ms(req.LeaseTTL)
		retention := ms(req.Retention)
		vals := values(map[string]types.AttributeValue{
			":owner": str(req.Owner), ":old": num(now - s.skew), ":now": num(now),
			":lease": num(lease), ":retention": num(retention), ":forget": num(lease + retention),
			":ttl": num(seconds(lease+retention+s.skew) + 1), ":ttl_after": num(seconds(retention+s.skew) + 1),
		})
		if req.Fingerprint != nil {
			vals[":fp"] = bin(req.Fingerprint)
		}
		if req.Origin != "" {
			vals[":origin"] = str(req.Origin)
		}
		set, cond := w.write(req.Fingerprint != nil, req.Origin != "")
		out, err := s.update(ctx, req.Key, set, cond, vals, types.ReturnValueAllNew)
		if err == nil {
			return s.acquired(req, w, out.Attributes)
		}
		old, failed := conditionFailed(err)
		if !failed {
			return backends.AcquireResult{}, opError("acquire", err)
		}
		it, present, err := s.image(ctx, req.Key, old)
		if err != nil {
			return backends.AcquireResult{}, opError("acquire", err)
		}
		now = s.now().UnixMilli()
		st, present := s.judgeIf(it, present, now)
		switch {
		case !present:
			w = fresh
		case st == backends.StateReleased:
			w = afterRelease
		case (st == backends.StateInProgress || st == backends.StateExpired) && it.owner == req.Owner:
			w = reentrant
		case st == backends.StateExpired:
			w = takeover
		default: // in progress for another owner, or completed
			res, done, err := s.busy(ctx, req, it, st, now)
			if done || err != nil {
				return res, err
			}
			// The fingerprint could not be adopted: the record changed.
		}
	}
	return backends.AcquireResult{}, fmt.Errorf("dynamostore: acquire %q: the record changed under each of %d writes", req.Key, maxRounds)
}

// judgeIf judges a record that is present.
func (s *Store) judgeIf(it item, present bool, now int64) (backends.State, bool) {
	if !present {
		return 0, false
	}
	return s.judge(it, now)
}

// image is the record a failed condition was checked against: the item
// DynamoDB returned with the failure, or, from a server that returns none
// (DynamoDB Local before 2023, dynalite), a strongly consistent read.
func (s *Store) image(ctx context.Context, key string, old map[string]types.AttributeValue) (item, bool, error) {
	if len(old) == 0 {
		return s.get(ctx, key)
	}
	it, err := decode(old)
	return it, err == nil, err
}

// acquired builds the result of a successful write of way w.
func (s *Store) acquired(req backends.AcquireRequest, w way, attrs map[string]types.AttributeValue) (backends.AcquireResult, error) {
	it, err := decode(attrs)
	if err != nil {
		return backends.AcquireResult{}, err
	}
	return backends.AcquireResult{
		Status: backends.StatusAcquired,
		Lease: backends.Lease{
			Key: req.Key, Owner: req.Owner, Token: it.token, Attempt: int(it.attempt),
			Takeover: w == takeover,
		},
		Reentrant:   w == reentrant,
		Fingerprint: it.fingerprint,
	}, nil
}

// busy answers for a record held by another owner or completed, first
// giving the record the request's fingerprint if it has none (the first
// fingerprint given is kept). done is false if that write found the
// record changed.
func (s *Store) busy(ctx context.Context, req backends.AcquireRequest, it item, st backends.State, now int64) (res backends.AcquireResult, done bool, err error) {
	if req.Fingerprint != nil && it.fingerprint == nil {
		vals := map[string]types.AttributeValue{":fp": bin(req.Fingerprint), ":old": num(now - s.skew)}
		_, err := s.update(ctx, req.Key, `SET #fp = :fp`, `#forget > :old AND attribute_not_exists(#fp)`, vals, types.ReturnValueNone)
		if _, failed := conditionFailed(err); failed {
			return backends.AcquireResult{}, false, nil
		}
		if err != nil {
			return backends.AcquireResult{}, true, opError("acquire", err)
		}
		it.fingerprint = req.Fingerprint
	}
	res = backends.AcquireResult{Fingerprint: it.fingerprint}
	if st == backends.StateCompleted {
		res.Status, res.CompletedAt, res.Output = backends.StatusCompleted, s.record(it, st).CompletedAt, it.output
	} else {
		res.Status, res.Remaining = backends.StatusInProgress, msDuration(it.lease+s.skew-now)
	}
	return res, true, nil
}
