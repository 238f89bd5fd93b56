package backends

import (
	"context"
	"fmt"
	"time"
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
	// wrapping [ErrInvalidRequest] for a malformed request or cursor (a
	// limit out of 1 to [MaxListLimit], an unknown state, a malformed
	// cursor). An error about the cursor wraps [ErrInvalidCursor] too;
	// the stores of this module (through storekit.ValidateList) also
	// refuse so a cursor of another namespace.
	List(ctx context.Context, req ListRequest) (ListPage, error)

	// Count counts the records of a namespace by state.
	Count(ctx context.Context, namespace string) (Counts, error)
}

// ErrInvalidCursor is wrapped by List's error for a cursor it cannot page
// from: malformed, or of another namespace. It wraps [ErrInvalidRequest],
// so errors.Is matches either.
var ErrInvalidCursor = fmt.Errorf("%w: list cursor", ErrInvalidRequest)

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
	// InProgress, Expired, Released and Completed count the records in
	// StateInProgress, StateExpired, StateReleased and StateCompleted.
	InProgress, Expired, Released, Completed int64
	// OldestInProgress is the Record.AcquiredAt of the records in
	// StateInProgress that was acquired first, by the store's clock: how
	// long the oldest live lease has been held. Zero when none is.
	OldestInProgress time.Time
}

// Total is the number of records counted.
func (c Counts) Total() int64 { return c.InProgress + c.Expired + c.Released + c.Completed }

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
