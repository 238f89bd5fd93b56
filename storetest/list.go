package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// The tests of the optional backends.Lister capability. A store without it
// skips them, saying so.
var listTests = []struct {
	name string
	fn   func(t *testing.T, s *suite, l backends.Lister)
}{
	{"ListPagesEveryRecordOnce", testListPagesEveryRecordOnce},
	{"ListByState", testListByState},
	{"ListEveryNamespace", testListEveryNamespace},
	{"ListWhileRecordsChange", testListWhileRecordsChange},
	{"ListInvalidRequests", testListInvalidRequests},
	{"Count", testCount},
}

// namespace is the suite's namespace: every s.key(name) is namespace:name.
func (s *suite) namespace() string { return strings.TrimSuffix(s.prefix, ":") }

// listAll pages through req's records, pages of req.Limit, and returns
// their keys in order; it fails on a page over the limit, a page out of
// order, or more pages than records could fill.
func listAll(t *testing.T, l backends.Lister, req backends.ListRequest) ([]string, []backends.Record) {
	t.Helper()
	var keys []string
	var recs []backends.Record
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10_000, "paging does not end")
		page, err := l.List(ctx(t), req)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page.Records), req.Limit, "page over the limit")
		for _, r := range page.Records {
			if len(keys) > 0 {
				require.Less(t, keys[len(keys)-1], r.Key, "records in the order of their keys' bytes")
			}
			keys = append(keys, r.Key)
			recs = append(recs, r)
		}
		if page.Cursor == "" {
			return keys, recs
		}
		req.Cursor = page.Cursor
	}
}

// fill makes records in every state under the suite's namespace, odd keys
// included, plus records just outside it, and returns the keys inside by
// state.
func (s *suite) fill(t *testing.T) map[backends.State][]string {
	t.Helper()
	c := ctx(t)
	byState := map[backends.State][]string{}
	add := func(st backends.State, key string) { byState[st] = append(byState[st], key) }
	for i, k := range OddKeys() {
		key := s.key("odd-" + k)
		l := s.mustAcquire(t, key, s.owner(), long)
		switch i % 3 {
		case 0:
			add(backends.StateInProgress, key)
		case 1:
			require.NoError(t, s.Store.Complete(c, l, []byte("out")))
			add(backends.StateCompleted, key)
		case 2:
			require.NoError(t, s.Store.Release(c, l))
			add(backends.StateReleased, key)
		}
	}
	for i := range 3 {
		key := s.key(fmt.Sprintf("expired-%d", i))
		s.mustAcquire(t, key, s.owner(), s.ticks(1))
		add(backends.StateExpired, key)
	}
	// Neighbours: a longer namespace with the same start, the namespace
	// itself as a key, and the namespace without its colon.
	for _, k := range []string{s.namespace() + "x:k", s.namespace(), s.namespace() + ";k"} {
		s.mustAcquire(t, k, s.owner(), long)
	}
	s.waitPast(2) // the short leases expire
	for _, keys := range byState {
		slices.Sort(keys)
	}
	return byState
}

func testListPagesEveryRecordOnce(t *testing.T, s *suite, l backends.Lister) {
	byState := s.fill(t)
	var want []string
	for _, keys := range byState {
		want = append(want, keys...)
	}
	slices.Sort(want)
	for _, limit := range []int{1, 3, backends.MaxListLimit} {
		keys, recs := listAll(t, l, backends.ListRequest{Namespace: s.namespace(), Limit: limit})
		require.Equal(t, want, keys, "limit %d: every record of the namespace once, no other", limit)
		for _, r := range recs {
			in := s.inspect(t, r.Key)
			require.Equal(t, in.State, r.State, "key %q", r.Key)
			require.Equal(t, in.Owner, r.Owner)
			require.Equal(t, in.Token, r.Token)
			require.Equal(t, in.Attempt, r.Attempt)
			require.Equal(t, in.Output, r.Output)
			require.Equal(t, in.Origin, r.Origin)
			require.Equal(t, originOf(r.Owner), r.Origin)
			require.True(t, in.AcquiredAt.Equal(r.AcquiredAt), "key %q: AcquiredAt", r.Key)
			require.WithinDuration(t, in.LeaseExpiresAt, r.LeaseExpiresAt, time.Millisecond)
		}
	}
}

func testListByState(t *testing.T, s *suite, l backends.Lister) {
	byState := s.fill(t)
	for st := backends.StateInProgress; st <= backends.StateCompleted; st++ {
		keys, recs := listAll(t, l, backends.ListRequest{Namespace: s.namespace(), State: st, Limit: 2})
		require.Equal(t, byState[st], keys, "state %v", st)
		for _, r := range recs {
			require.Equal(t, st, r.State)
		}
	}
}

// An empty namespace lists every record: here, from just before the
// suite's keys, which sort together.
func testListEveryNamespace(t *testing.T, s *suite, l backends.Lister) {
	keys := []string{s.key("a"), s.key("b"), s.key("c")}
	for _, k := range keys {
		s.mustAcquire(t, k, s.owner(), long)
	}
	page, err := l.List(ctx(t), backends.ListRequest{Limit: 3, Cursor: storekit.ListCursor(s.prefix)})
	require.NoError(t, err)
	got := make([]string, len(page.Records))
	for i, r := range page.Records {
		got[i] = r.Key
	}
	require.Equal(t, keys, got)
}

// Paging returns every record that exists throughout exactly once while
// other goroutines complete, release and delete records and add new ones.
func testListWhileRecordsChange(t *testing.T, s *suite, l backends.Lister) {
	const existing = 60
	// The records that must exist throughout outlive any test run: a
	// loaded machine can stretch the listings past a minute, and a record
	// that expired meanwhile did not exist throughout.
	const throughout = time.Hour
	leases := make([]backends.Lease, existing)
	for i := range leases {
		res, err := s.Store.Acquire(ctx(t), backends.AcquireRequest{
			Key: s.key(fmt.Sprintf("k%03d", i)), Owner: s.owner(), LeaseTTL: throughout, Retention: throughout,
		})
		require.NoError(t, err)
		require.Equal(t, backends.StatusAcquired, res.Status)
		leases[i] = res.Lease
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var changeErr error
	var mu sync.Mutex
	wg.Go(func() {
		// At most 2000 changes, paced, so that the pages can end; each
		// change bounded on its own, as a loaded machine can stretch them
		// all past any one call's bound.
		for i := range 2000 {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Microsecond):
			}
			c, cancel := context.WithTimeout(context.Background(), callTimeout)
			var err error
			switch l := leases[i%existing]; i % 4 {
			case 0:
				err = s.Store.Complete(c, l, nil)
			case 1:
				err = s.Store.Release(c, l)
			case 2:
				added := s.key(fmt.Sprintf("k%03d-new-%d", i%existing, i))
				_, err = s.Store.Acquire(c, backends.AcquireRequest{Key: added, Owner: s.owner(), LeaseTTL: long, Retention: long})
				if err == nil && i%8 == 2 {
					err = s.Store.Delete(c, added)
				}
			}
			cancel()
			if err != nil && !errors.Is(err, backends.ErrLeaseLost) {
				mu.Lock()
				changeErr = err
				mu.Unlock()
				return
			}
		}
	})
	var keys []string
	for range 3 {
		got, _ := listAll(t, l, backends.ListRequest{Namespace: s.namespace(), Limit: 3})
		keys = got
		seen := map[string]int{}
		for _, k := range got {
			seen[k]++
			require.Equal(t, 1, seen[k], "key %q listed twice", k)
		}
		for i := range existing {
			require.Equal(t, 1, seen[s.key(fmt.Sprintf("k%03d", i))], "a record that existed throughout was skipped")
		}
	}
	close(stop)
	wg.Wait()
	require.NoError(t, changeErr)
	require.Greater(t, len(keys), existing/2, "the pages hold the records")
}

func testListInvalidRequests(t *testing.T, s *suite, l backends.Lister) {
	for name, req := range map[string]backends.ListRequest{
		"zero limit":       {Namespace: s.namespace()},
		"limit too large":  {Namespace: s.namespace(), Limit: backends.MaxListLimit + 1},
		"malformed cursor": {Namespace: s.namespace(), Limit: 1, Cursor: "not base64!"},
		"unknown state":    {Namespace: s.namespace(), Limit: 1, State: backends.StateCompleted + 1},
	} {
		_, err := l.List(ctx(t), req)
		require.ErrorIs(t, err, backends.ErrInvalidRequest, name)
	}
}

// testCount checks the counts by state, and the oldest lease in
// progress: records acquired before it, whose leases then expired, were
// released or completed, do not count as in progress, however old.
func testCount(t *testing.T, s *suite, l backends.Lister) {
	c, err := l.Count(ctx(t), s.namespace())
	require.NoError(t, err)
	require.Zero(t, c, "an empty namespace")

	early := map[backends.State]string{}
	for _, st := range []backends.State{backends.StateExpired, backends.StateReleased, backends.StateCompleted} {
		key := s.key("early-" + st.String())
		ttl := long
		if st == backends.StateExpired {
			ttl = s.ticks(1)
		}
		lease := s.mustAcquire(t, key, s.owner(), ttl)
		switch st {
		case backends.StateReleased:
			require.NoError(t, s.Store.Release(ctx(t), lease))
		case backends.StateCompleted:
			require.NoError(t, s.Store.Complete(ctx(t), lease, nil))
		}
		early[st] = key
	}
	s.wait(1) // the records after these are acquired later by any clock

	byState := s.fill(t)
	for st, key := range early {
		byState[st] = append(byState[st], key)
	}
	var oldest time.Time
	for _, key := range byState[backends.StateInProgress] {
		rec := s.inspect(t, key)
		require.Equal(t, backends.StateInProgress, rec.State)
		if oldest.IsZero() || rec.AcquiredAt.Before(oldest) {
			oldest = rec.AcquiredAt
		}
	}
	for st, key := range early {
		require.True(t, s.inspect(t, key).AcquiredAt.Before(oldest), "%v: acquired before every lease in progress", st)
	}
	c, err = l.Count(ctx(t), s.namespace())
	require.NoError(t, err)
	require.True(t, oldest.Equal(c.OldestInProgress), "OldestInProgress %v, want %v", c.OldestInProgress, oldest)
	c.OldestInProgress = oldest // the same instant: compare the rest whole
	require.Equal(t, backends.Counts{
		InProgress:       int64(len(byState[backends.StateInProgress])),
		Expired:          int64(len(byState[backends.StateExpired])),
		Released:         int64(len(byState[backends.StateReleased])),
		Completed:        int64(len(byState[backends.StateCompleted])),
		OldestInProgress: oldest,
	}, c)

	// Once no lease is in progress, there is no oldest.
	ns := s.namespace() + "-none"
	lease, err := s.Store.Acquire(ctx(t), backends.AcquireRequest{Key: ns + ":k", Owner: s.owner(), LeaseTTL: long, Retention: long})
	require.NoError(t, err)
	require.NoError(t, s.Store.Release(ctx(t), lease.Lease))
	c, err = l.Count(ctx(t), ns)
	require.NoError(t, err)
	require.Equal(t, backends.Counts{Released: 1}, c)
}
