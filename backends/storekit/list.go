package storekit

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// ValidateList reports whether a List request is well formed (its limit
// 1 to [backends.MaxListLimit], its state known, its cursor one that
// [ListCursor] wrote for a key of the request's namespace), wrapping
// [backends.ErrInvalidRequest] if not, and [backends.ErrInvalidCursor]
// too when the cursor is at fault. A store calls it in List before it
// touches the server. A cursor of another namespace is refused rather than
// answered with a page that is wrongly empty; an empty namespace takes the
// cursor of any.
func ValidateList(req backends.ListRequest) error {
	if req.Limit < 1 || req.Limit > backends.MaxListLimit {
		return fmt.Errorf("%w: list limit out of range (1 to %d): %d", backends.ErrInvalidRequest, backends.MaxListLimit, req.Limit)
	}
	if req.State != 0 && (req.State < backends.StateInProgress || req.State > backends.StateCompleted) {
		return fmt.Errorf("%w: unknown state %d", backends.ErrInvalidRequest, int(req.State))
	}
	after, err := ParseListCursor(req.Cursor)
	if err != nil {
		return err
	}
	if prefix := ListPrefix(req.Namespace); after != "" && !strings.HasPrefix(after, prefix) {
		return fmt.Errorf("%w %q continues after %q, not a key of namespace %q", backends.ErrInvalidCursor, req.Cursor, after, req.Namespace)
	}
	return nil
}

// ListPrefix is the key prefix a namespace selects: namespace + ":", or
// empty, for every record, when namespace is empty.
func ListPrefix(namespace string) string {
	if namespace == "" {
		return ""
	}
	return namespace + ":"
}

// ListRange is the key range a namespace selects, for a store that keeps
// its keys in order: from lower up to, not including, upper; upper is nil
// for every key (an empty namespace). The prefix ends with ':', so the
// first key after the range ends with ';' instead.
func ListRange(namespace string) (lower, upper []byte) {
	prefix := ListPrefix(namespace)
	lower = []byte(prefix)
	if prefix == "" {
		return lower, nil
	}
	upper = []byte(prefix)
	upper[len(upper)-1]++
	return lower, upper
}

// ListCursor is the cursor of a page whose last record has key last:
// the key's bytes, base64url-encoded. Every store of this repository
// pages by key with it, and [ParseListCursor] reads it back.
func ListCursor(last string) string { return base64.RawURLEncoding.EncodeToString([]byte(last)) }

// ParseListCursor decodes a cursor [ListCursor] wrote into the last key
// of the previous page: empty for an empty cursor (the first page). It
// returns an error wrapping [backends.ErrInvalidCursor] (and so
// [backends.ErrInvalidRequest]) for a cursor that is not base64url as
// ListCursor writes it (unpadded, canonical) or decodes to no key, or one
// too long.
func ParseListCursor(cursor string) (after string, err error) {
	if cursor == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(cursor)
	if err != nil || len(b) == 0 || len(b) > backends.MaxKeyBytes {
		return "", fmt.Errorf("%w %q is malformed", backends.ErrInvalidCursor, cursor)
	}
	return string(b), nil
}

// Page fills the page req asks for, for a store whose server cannot read
// its keys in order (Redis, DynamoDB, a map). keys are the keys of the
// records of req's namespace, in any order and possibly repeated, as a
// scan of the server finds them. Page sorts them, drops those up to the
// key of req.Cursor, and reads the records of the rest in order with
// read, at most maxBatch keys a call (no bound if maxBatch is 0), until
// the page holds req.Limit records or no key is left. read returns the
// records of the keys it is given that still exist, in the order of the
// keys; Page keeps those in req.State (any, if zero), and sets the page's
// cursor when the page is full.
//
// Validate req with [ValidateList] first. Page changes keys.
func Page(ctx context.Context, req backends.ListRequest, keys []string, maxBatch int,
	read func(ctx context.Context, keys []string) ([]backends.Record, error)) (backends.ListPage, error) {
	after, err := ParseListCursor(req.Cursor)
	if err != nil {
		return backends.ListPage{}, err
	}
	keys = sortedAfter(keys, after)
	var page backends.ListPage
	for len(keys) > 0 && len(page.Records) < req.Limit {
		// A few more than the page still needs: some may be gone since
		// the scan, or in another state.
		n := min(len(keys), max(req.Limit-len(page.Records), 16))
		if maxBatch > 0 {
			n = min(n, maxBatch)
		}
		batch := keys[:n]
		keys = keys[n:]
		recs, err := read(ctx, batch)
		if err != nil {
			return backends.ListPage{}, err
		}
		for _, rec := range recs {
			if req.State != 0 && rec.State != req.State {
				continue
			}
			page.Records = append(page.Records, rec)
			if len(page.Records) == req.Limit {
				page.Cursor = ListCursor(rec.Key)
				break
			}
		}
	}
	return page, nil
}

// sortedAfter sorts keys, drops duplicates and returns those after after.
func sortedAfter(keys []string, after string) []string {
	slices.Sort(keys)
	keys = slices.Compact(keys)
	i, found := slices.BinarySearch(keys, after)
	if found {
		i++
	}
	return keys[i:]
}

// AddCount counts one record in state s, acquired at acquiredAt (its
// Record.AcquiredAt), into c, for a store that counts records one by one
// (Lister.Count): a record in StateInProgress acquired before
// c.OldestInProgress, or the first one, becomes the oldest. A zero
// acquiredAt (a record written before stores kept it) counts but is never
// the oldest. A state out of range counts nowhere.
func AddCount(c *backends.Counts, s backends.State, acquiredAt time.Time) {
	switch s {
	case backends.StateInProgress:
		c.InProgress++
		if !acquiredAt.IsZero() && (c.OldestInProgress.IsZero() || acquiredAt.Before(c.OldestInProgress)) {
			c.OldestInProgress = acquiredAt
		}
	case backends.StateExpired:
		c.Expired++
	case backends.StateReleased:
		c.Released++
	case backends.StateCompleted:
		c.Completed++
	}
}
