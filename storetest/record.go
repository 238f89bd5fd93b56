package storetest

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
)

// The tests of what a record tells an operator: which delivery holds or
// completed a key (Origin), since when (AcquiredAt), and the same fields
// in each state on every store.

// testOrigin checks that a record keeps the origin of the acquisition
// that took its current or last lease: kept by a re-entrant Acquire, a
// renewal, a release and a completion, untouched by duplicates, replaced
// by the next acquisition (a takeover too), even by none.
func testOrigin(t *testing.T, s *suite) {
	c := ctx(t)
	key := s.key("k")
	origin := func() string { t.Helper(); return s.inspect(t, key).Origin }
	first := s.owner()
	res := s.acquireFrom(t, key, first, "first delivery", long)
	require.Equal(t, backends.StatusAcquired, res.Status)
	l := res.Lease
	require.Equal(t, "first delivery", origin())

	again := s.acquireFrom(t, key, first, "first delivery, asked again", long)
	require.True(t, again.Reentrant)
	require.Equal(t, "first delivery", origin(), "a re-entrant Acquire keeps the origin it first gave")
	require.Equal(t, backends.StatusInProgress, s.acquireFrom(t, key, s.owner(), "a duplicate", long).Status)
	require.Equal(t, "first delivery", origin(), "a duplicate in progress changes nothing")
	require.NoError(t, s.Store.Renew(c, l, long))
	require.Equal(t, "first delivery", origin(), "renewed")
	require.NoError(t, s.Store.Release(c, l))
	require.Equal(t, "first delivery", origin(), "a released record tells who released it")

	second := s.acquireFrom(t, key, s.owner(), "second delivery", long)
	require.Equal(t, backends.StatusAcquired, second.Status)
	require.Equal(t, "second delivery", origin(), "the next acquisition replaces it")
	require.NoError(t, s.Store.Complete(c, second.Lease, []byte("out")))
	require.Equal(t, "second delivery", origin(), "a completed record tells which delivery completed it")
	require.Equal(t, backends.StatusCompleted, s.acquireFrom(t, key, s.owner(), "a late duplicate", long).Status)
	require.Equal(t, "second delivery", origin(), "a duplicate of completed work changes nothing")

	// A takeover replaces it too; an acquisition that gives none leaves
	// none.
	key = s.key("taken-over")
	s.acquireFrom(t, key, s.owner(), "stalled delivery", s.ticks(1))
	s.waitPast(2)
	require.Equal(t, backends.StateExpired, s.inspect(t, key).State)
	require.Equal(t, "stalled delivery", origin(), "an expired lease still tells whose it was")
	took := s.acquireFrom(t, key, s.owner(), "redelivery", long)
	require.True(t, took.Lease.Takeover)
	require.Equal(t, "redelivery", origin())
	require.NoError(t, s.Store.Release(c, took.Lease))
	require.Equal(t, backends.StatusAcquired, s.acquireFrom(t, key, s.owner(), "", long).Status)
	require.Empty(t, origin(), "an acquisition without an origin replaces the last one with none")
}

// testOrigins checks what an origin may be: up to MaxOriginBytes of UTF-8
// text without NUL, kept exactly; anything else is an invalid request in
// every store alike, refused before the server is asked.
func testOrigins(t *testing.T, s *suite) {
	c := ctx(t)
	longest := strings.Repeat("é", backends.MaxOriginBytes/2) + "x" // 255 bytes
	require.Len(t, longest, backends.MaxOriginBytes)
	for i, origin := range []string{
		longest, "message_uuid=0b1c5b8e-6f9a-4b8e-9d3c-2f1e0a9b8c7d handler=charge-order",
		`handler="quote\"d = x" message_uuid=''; DROP TABLE x; --`, "ünïcødé-🔑 tab\tnewline\n%s%d\\",
	} {
		key := s.key(string(rune('a' + i)))
		l := s.mustAcquireFrom(t, key, origin)
		require.Equal(t, origin, s.inspect(t, key).Origin)
		require.NoError(t, s.Store.Complete(c, l, nil))
		require.Equal(t, origin, s.inspect(t, key).Origin)
	}
	key := s.key("bad")
	for name, origin := range map[string]string{
		"invalid UTF-8":  "message_uuid=\xff",
		"NUL":            "message_uuid=a\x00b",
		"over the limit": longest + "y",
	} {
		_, err := s.Store.Acquire(c, backends.AcquireRequest{Key: key, Owner: s.owner(), LeaseTTL: long, Retention: long, Origin: origin})
		require.ErrorIs(t, err, backends.ErrInvalidRequest, name)
	}
	_, err := s.Store.Inspect(c, key)
	require.ErrorIs(t, err, backends.ErrNotFound, "invalid origins changed nothing")
}

func (s *suite) mustAcquireFrom(t *testing.T, key, origin string) backends.Lease {
	t.Helper()
	res := s.acquireFrom(t, key, s.owner(), origin, long)
	require.Equal(t, backends.StatusAcquired, res.Status, "acquire %q", key)
	return res.Lease
}

// testAcquiredAt checks when a record says its lease was acquired: by the
// store's clock, the lease's TTL before the lease's end as first taken;
// kept by a re-entrant Acquire, a renewal, a release and a completion;
// moved by the next acquisition and by a takeover.
func testAcquiredAt(t *testing.T, s *suite) {
	c := ctx(t)
	key, owner := s.key("k"), s.owner()
	l := s.mustAcquire(t, key, owner, long)
	rec := s.inspect(t, key)
	acquired := rec.AcquiredAt
	require.False(t, acquired.IsZero(), "AcquiredAt of a lease in progress")
	// Rounding of the TTL to the store's precision aside.
	require.WithinDuration(t, acquired.Add(long), rec.LeaseExpiresAt, time.Millisecond,
		"the lease runs its TTL from AcquiredAt, on the store's clock")

	same := func(what string) backends.Record {
		t.Helper()
		rec := s.inspect(t, key)
		require.True(t, acquired.Equal(rec.AcquiredAt), "%s: AcquiredAt %v, was %v", what, rec.AcquiredAt, acquired)
		return rec
	}
	s.wait(1)
	require.True(t, s.acquire(t, key, owner, 2*long).Reentrant)
	rec = same("after a re-entrant Acquire")
	require.True(t, rec.LeaseExpiresAt.After(acquired.Add(long)), "the re-entrant Acquire extended the lease")
	s.wait(1)
	require.NoError(t, s.Store.Renew(c, l, 3*long))
	same("after a renewal")
	require.NoError(t, s.Store.Release(c, l))
	same("after a release")

	s.wait(1)
	next := s.mustAcquire(t, key, s.owner(), s.ticks(1))
	rec = s.inspect(t, key)
	require.True(t, rec.AcquiredAt.After(acquired), "the next acquisition moves it: %v, was %v", rec.AcquiredAt, acquired)
	require.WithinDuration(t, rec.AcquiredAt.Add(s.ticks(1)), rec.LeaseExpiresAt, time.Millisecond)
	acquired = rec.AcquiredAt
	s.waitPast(2)
	require.Equal(t, backends.StateExpired, same("expired").State)

	took := s.mustAcquire(t, key, s.owner(), long)
	s.requireLost(t, next)
	rec = s.inspect(t, key)
	require.True(t, rec.AcquiredAt.After(acquired), "a takeover moves it: %v, was %v", rec.AcquiredAt, acquired)
	acquired = rec.AcquiredAt
	require.NoError(t, s.Store.Complete(c, took, nil))
	same("completed")
}

// testRecordFields checks that every store reports the same fields for a
// record in each state, and the same lease end for a lease that ended
// early: a completed record's LeaseExpiresAt is its CompletedAt, a
// released record's the moment of the release. List reports each record
// as Inspect does.
func testRecordFields(t *testing.T, s *suite) {
	c := ctx(t)
	fp := []byte("sha256:fields")
	acquire := func(name string, ttl time.Duration) (string, backends.Lease) {
		key := s.key(name)
		owner := s.owner()
		res, err := s.Store.Acquire(c, backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: ttl, Retention: long,
			Fingerprint: fp, Origin: originOf(owner)})
		require.NoError(t, err)
		require.Equal(t, backends.StatusAcquired, res.Status)
		return key, res.Lease
	}
	// Leases that outlast any test, however loaded the machine: a lease
	// that ended early ended well before the end it was taken with.
	const held = time.Hour
	byState := map[backends.State]string{}
	byState[backends.StateInProgress], _ = acquire("in-progress", held)
	byState[backends.StateExpired], _ = acquire("expired", s.ticks(1))
	released, rl := acquire("released", held)
	byState[backends.StateReleased] = released
	completed, cl := acquire("completed", held)
	byState[backends.StateCompleted] = completed
	s.waitPast(2) // the expired lease runs out; the others end after a while
	require.NoError(t, s.Store.Release(c, rl))
	require.NoError(t, s.Store.Complete(c, cl, []byte("out")))

	lease := []string{"AcquiredAt", "Attempt", "ExpiresAt", "Fingerprint", "Key", "LeaseExpiresAt", "Origin", "Owner", "State", "Token"}
	want := map[backends.State][]string{
		backends.StateInProgress: lease,
		backends.StateExpired:    lease,
		backends.StateReleased:   lease,
		backends.StateCompleted:  append(slices.Clone(lease), "CompletedAt", "Output"),
	}
	recs := map[backends.State]backends.Record{}
	for st, key := range byState {
		rec := s.inspect(t, key)
		require.Equal(t, st, rec.State, "key %q", key)
		wantSet := slices.Sorted(slices.Values(want[st]))
		require.Equal(t, wantSet, nonZeroFields(rec), "the fields of a record %v", st)
		require.Equal(t, originOf(rec.Owner), rec.Origin)
		require.False(t, rec.LeaseExpiresAt.Before(rec.AcquiredAt), "%v: the lease ends after it was acquired", st)
		recs[st] = rec
	}

	done := recs[backends.StateCompleted]
	require.True(t, done.LeaseExpiresAt.Equal(done.CompletedAt),
		"a completed record's lease ended with the completion: LeaseExpiresAt %v, CompletedAt %v", done.LeaseExpiresAt, done.CompletedAt)
	require.True(t, done.LeaseExpiresAt.Before(done.AcquiredAt.Add(held)), "not the lease's end as acquired")
	rel := recs[backends.StateReleased]
	require.True(t, rel.LeaseExpiresAt.Before(rel.AcquiredAt.Add(held)),
		"a released record's lease ended with the release, not at %v", rel.AcquiredAt.Add(held))
	require.WithinDuration(t, rel.LeaseExpiresAt.Add(long), rel.ExpiresAt, time.Millisecond,
		"a released record is kept for its retention from the release, when its lease ended")

	l, ok := s.Store.(backends.Lister)
	if !ok {
		return
	}
	page, err := l.List(c, backends.ListRequest{Namespace: s.namespace(), Limit: 10})
	require.NoError(t, err)
	require.Len(t, page.Records, len(byState))
	for _, r := range page.Records {
		requireSameRecord(t, recs[r.State], r)
	}
}

// nonZeroFields returns the names of rec's fields that are not zero, in
// order.
func nonZeroFields(rec backends.Record) []string {
	v := reflect.ValueOf(rec)
	var names []string
	for i := range v.NumField() {
		if !v.Field(i).IsZero() {
			names = append(names, v.Type().Field(i).Name)
		}
	}
	slices.Sort(names)
	return names
}

// requireSameRecord checks that got is want, field by field, times by
// their instant.
func requireSameRecord(t *testing.T, want, got backends.Record) {
	t.Helper()
	times := func(r backends.Record) []time.Time {
		return []time.Time{r.AcquiredAt, r.LeaseExpiresAt, r.CompletedAt, r.ExpiresAt}
	}
	wt, gt := times(want), times(got)
	for i := range wt {
		require.True(t, wt[i].Equal(gt[i]), "key %q: time %d: %v, want %v", want.Key, i, gt[i], wt[i])
	}
	want.AcquiredAt, want.LeaseExpiresAt, want.CompletedAt, want.ExpiresAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	got.AcquiredAt, got.LeaseExpiresAt, got.CompletedAt, got.ExpiresAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	require.Equal(t, want, got)
}
