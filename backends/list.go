package backends

import (
	"context"
	"encoding/base64"
	"fmt"
)

// MaxListLimit is the largest page a [Lister] returns.
const MaxListLimit = 1000

// Lister is an optional capability of a [Store]: paging through the
// records of a namespace and counting them by state. It is for operators
// (the idem command), never on the middleware's path. Every store of this
// module and its store modules implements it (memstore, redisstore,
// pgstore, mysqlstore, dynamostore), and storetest checks it.
//
// Paging returns every record that exists throughout the paging exactly
// once, in the order of their keys' bytes, while other records are added,
// completed, released or deleted: a record that changes state may appear
// in either state; a record added or deleted meanwhile may or may not
// appear, but never twice. Records past their retention are never listed.
type Lister interface {
	// List returns the page of records after req.Cursor, or an error
	// wrapping [ErrInvalidRequest] for a malformed request or cursor.
	List(ctx context.Context, req ListRequest) (ListPage, error)

	// Count counts the records of a namespace by state.
	Count(ctx context.Context, namespace string) (Counts, error)
}

// ListRequest asks a [Lister] for one page.
type ListRequest struct {
	// Namespace selects the records whose key is Namespace + ":" + anything.
	// Empty selects every record.
	Namespace string
	// State, if not zero, keeps only the records in that state.
	State State
	// Limit is the most records the page holds: 1 to [MaxListLimit].
	Limit int
	// Cursor is the previous page's ListPage.Cursor, or empty for the first
	// page. It is opaque, and good for the same store and namespace only.
	Cursor string
}

// Validate reports whether the request is well formed, wrapping
// [ErrInvalidRequest] if not. Listers call it before they touch the server.
func (r ListRequest) Validate() error {
	if r.Limit < 1 || r.Limit > MaxListLimit {
		return fmt.Errorf("%w: list limit out of range (1 to %d): %d", ErrInvalidRequest, MaxListLimit, r.Limit)
	}
	if r.State != 0 && (r.State < StateInProgress || r.State > StateCompleted) {
		return fmt.Errorf("%w: unknown state %d", ErrInvalidRequest, int(r.State))
	}
	if _, err := r.After(); err != nil {
		return err
	}
	return nil
}

// Prefix is the key prefix the request selects: Namespace + ":", or empty
// for every record.
func (r ListRequest) Prefix() string {
	if r.Namespace == "" {
		return ""
	}
	return r.Namespace + ":"
}

// Range is the key range the request's namespace selects, for stores
// that keep keys in order: from lower up to, not including, upper; upper
// is nil for every key. The prefix ends with ':', so the first key after
// the range ends with ';' instead.
func (r ListRequest) Range() (lower, upper []byte) {
	prefix := r.Prefix()
	lower = []byte(prefix)
	if prefix == "" {
		return lower, nil
	}
	upper = []byte(prefix)
	upper[len(upper)-1]++
	return lower, upper
}

// After decodes the cursor into the last key of the previous page (empty
// for the first page), wrapping [ErrInvalidRequest] if it is malformed.
// Listers that page by key, as this package's stores do, use it with
// [ListCursor].
func (r ListRequest) After() (string, error) {
	if r.Cursor == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(r.Cursor)
	if err != nil || len(b) == 0 || len(b) > MaxKeyBytes {
		return "", fmt.Errorf("%w: malformed list cursor %q", ErrInvalidRequest, r.Cursor)
	}
	return string(b), nil
}

// ListCursor is the cursor of a page whose last record has key last, as
// [ListRequest.After] reads it.
func ListCursor(last string) string { return base64.RawURLEncoding.EncodeToString([]byte(last)) }

// ListPage is one page of records.
type ListPage struct {
	// Records are in the order of their keys' bytes. A page may hold fewer
	// records than the limit, even none, and still not be the last.
	Records []Record
	// Cursor asks for the next page; empty when there is none.
	Cursor string
}

// Counts is how many records of a namespace are in each state.
type Counts struct {
	InProgress, Expired, Released, Completed int64
}

// Total is the number of records counted.
func (c Counts) Total() int64 { return c.InProgress + c.Expired + c.Released + c.Completed }

// Add counts one record in state s.
func (c *Counts) Add(s State) {
	switch s {
	case StateInProgress:
		c.InProgress++
	case StateExpired:
		c.Expired++
	case StateReleased:
		c.Released++
	case StateCompleted:
		c.Completed++
	}
}

// ParseState returns the state named s ("in_progress", "expired",
// "released" or "completed"), or an error wrapping [ErrInvalidRequest].
func ParseState(s string) (State, error) {
	for st := StateInProgress; st <= StateCompleted; st++ {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown state %q (in_progress, expired, released, completed)", ErrInvalidRequest, s)
}
