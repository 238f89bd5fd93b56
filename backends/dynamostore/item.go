package dynamostore

import (
	"fmt"
	"maps"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-idempotency/idempotency/backends"
)

// The item's attributes (docs/dynamodb.md describes them). Times are Unix
// milliseconds by the clock of the process that wrote them; ttl is Unix
// seconds, for DynamoDB's TTL.
const (
	attrID        = "id"           // B, the partition key: the key's bytes
	attrState     = "state"        // N: 1 leased (live or expired by lease_ms), 2 released, 3 completed
	attrOwner     = "owner"        // S
	attrOrigin    = "origin"       // S: what acquired the lease (AcquireRequest.Origin); absent for none
	attrToken     = "token"        // N: the fencing token
	attrAttempt   = "attempt"      // N
	attrAcquired  = "acquired_ms"  // N: when the lease was acquired
	attrLease     = "lease_ms"     // N: when the lease expires
	attrRetention = "retention_ms" // N
	attrForget    = "forget_ms"    // N: the record counts as absent from then on
	attrCompleted = "completed_ms" // N
	attrFinger    = "fingerprint"  // B
	attrOutput    = "output"       // B
	attrTTLAfter  = "ttl_after_s"  // N: how long after the lease or completion ttl falls
	attrTTL       = "ttl"          // N: Unix seconds, DynamoDB's TTL attribute
)

// State values of the state attribute.
const (
	stateLeased    = 1
	stateReleased  = 2
	stateCompleted = 3
)

// names maps every placeholder an expression may use to its attribute.
var names = map[string]string{
	"#id": attrID, "#state": attrState, "#owner": attrOwner, "#token": attrToken,
	"#attempt": attrAttempt, "#lease": attrLease, "#retention": attrRetention,
	"#forget": attrForget, "#completed": attrCompleted, "#fp": attrFinger,
	"#output": attrOutput, "#ttl_after": attrTTLAfter, "#ttl": attrTTL,
	"#origin": attrOrigin, "#acquired": attrAcquired,
}

var placeholder = regexp.MustCompile(`[#:][a-z_]+`)

// expr is one call's expressions with the names and values they use:
// DynamoDB refuses a name or value that no expression mentions.
type expr struct {
	Names  map[string]string
	Values map[string]types.AttributeValue
}

// bind returns the names and values that exprs use, taking values from
// vals. The placeholders of each set of expressions are found once.
func bind(vals map[string]types.AttributeValue, exprs ...string) expr {
	ph := placeholdersOf(exprs)
	e := expr{Names: make(map[string]string, len(ph.names)), Values: make(map[string]types.AttributeValue, len(ph.values))}
	for _, n := range ph.names {
		e.Names[n] = names[n]
	}
	for _, v := range ph.values {
		e.Values[v] = vals[v]
	}
	if len(e.Values) == 0 {
		e.Values = nil
	}
	return e
}

type placeholders struct{ names, values []string }

// parsed caches the placeholders of each set of expressions, keyed by the
// expressions joined: the store uses a few dozen.
var parsed sync.Map // string -> placeholders

func placeholdersOf(exprs []string) placeholders {
	key := strings.Join(exprs, "\x00")
	if ph, ok := parsed.Load(key); ok {
		return ph.(placeholders)
	}
	var ph placeholders
	seen := map[string]bool{}
	for _, p := range placeholder.FindAllString(key, -1) {
		if seen[p] {
			continue
		}
		seen[p] = true
		if p[0] == '#' {
			ph.names = append(ph.names, p)
		} else {
			ph.values = append(ph.values, p)
		}
	}
	parsed.Store(key, ph)
	return ph
}

func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func bin(b []byte) types.AttributeValue { return &types.AttributeValueMemberB{Value: b} }

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

// keyOf is the primary key of the record of key.
func keyOf(key string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrID: bin([]byte(key))}
}

// values returns the constant values every expression may use, with more
// merged in.
func values(more map[string]types.AttributeValue) map[string]types.AttributeValue {
	v := map[string]types.AttributeValue{
		":zero": num(0), ":one": num(stateLeased), ":two": num(stateReleased), ":three": num(stateCompleted),
	}
	maps.Copy(v, more)
	return v
}

// item is a record as stored.
type item struct {
	key                                                        string
	state                                                      int64
	owner, origin                                              string
	token, attempt, acquired, lease, retention, forget, doneAt int64
	fingerprint, output                                        []byte
}

// decode reads an item; attributes it lacks are zero. It fails on an
// attribute of the wrong type, which only a foreign writer could cause.
func decode(av map[string]types.AttributeValue) (item, error) {
	var it item
	for name, v := range av {
		var err error
		switch name {
		case attrID:
			var b []byte
			b, err = asBytes(v)
			it.key = string(b)
		case attrState:
			it.state, err = asInt(v)
		case attrOwner:
			it.owner, err = asString(v)
		case attrOrigin:
			it.origin, err = asString(v)
		case attrAcquired:
			it.acquired, err = asInt(v)
		case attrToken:
			it.token, err = asInt(v)
		case attrAttempt:
			it.attempt, err = asInt(v)
		case attrLease:
			it.lease, err = asInt(v)
		case attrRetention:
			it.retention, err = asInt(v)
		case attrForget:
			it.forget, err = asInt(v)
		case attrCompleted:
			it.doneAt, err = asInt(v)
		case attrFinger:
			it.fingerprint, err = asBytes(v)
		case attrOutput:
			it.output, err = asBytes(v)
		}
		if err != nil {
			return item{}, fmt.Errorf("dynamostore: malformed item: attribute %s: %w", name, err)
		}
	}
	return it, nil
}

func asString(v types.AttributeValue) (string, error) {
	s, ok := v.(*types.AttributeValueMemberS)
	if !ok {
		return "", fmt.Errorf("not a string")
	}
	return s.Value, nil
}

func asInt(v types.AttributeValue) (int64, error) {
	n, ok := v.(*types.AttributeValueMemberN)
	if !ok {
		return 0, fmt.Errorf("not a number")
	}
	return strconv.ParseInt(n.Value, 10, 64)
}

func asBytes(v types.AttributeValue) ([]byte, error) {
	b, ok := v.(*types.AttributeValueMemberB)
	if !ok {
		return nil, fmt.Errorf("not binary")
	}
	if len(b.Value) == 0 {
		return nil, nil
	}
	return b.Value, nil
}

// judge returns the item's state at now (Unix ms) as every process judges
// it: a lease expires, and a record is forgotten, only skew after the
// time written in it. ok is false for a record that counts as absent.
func (s *Store) judge(it item, now int64) (st backends.State, ok bool) {
	old := now - s.skew
	if it.forget <= old {
		return 0, false
	}
	switch it.state {
	case stateCompleted:
		return backends.StateCompleted, true
	case stateReleased:
		return backends.StateReleased, true
	case stateLeased:
		if it.lease > old {
			return backends.StateInProgress, true
		}
		return backends.StateExpired, true
	}
	return 0, false
}

// record converts an item that counts as present into a Record. A
// completed lease ended at the completion, a released one at the release,
// one retention before the record is forgotten.
func (s *Store) record(it item, st backends.State) backends.Record {
	rec := backends.Record{
		Key: it.key, State: st, Owner: it.owner, Token: it.token, Attempt: int(it.attempt),
		LeaseExpiresAt: time.UnixMilli(it.lease), ExpiresAt: time.UnixMilli(it.forget),
		Fingerprint: it.fingerprint, Output: it.output, Origin: it.origin, AcquiredAt: it.acquiredAt(),
	}
	switch st {
	case backends.StateCompleted:
		rec.CompletedAt = time.UnixMilli(it.doneAt)
		rec.LeaseExpiresAt = rec.CompletedAt
	case backends.StateReleased:
		rec.LeaseExpiresAt = time.UnixMilli(it.forget - it.retention)
	}
	return rec
}

// acquiredAt is when the item's lease was acquired: zero for an item an
// earlier release wrote, which did not keep it.
func (it item) acquiredAt() time.Time {
	if it.acquired == 0 {
		return time.Time{}
	}
	return time.UnixMilli(it.acquired)
}
