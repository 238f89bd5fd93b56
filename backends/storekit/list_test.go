package storekit_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// A namespace's range holds its keys and none of its neighbours'.
func TestListRange(t *testing.T) {
	lower, upper := storekit.ListRange("orders")
	require.Equal(t, "orders:", string(lower))
	require.Equal(t, "orders;", string(upper))
	for _, key := range []string{"orders:", "orders:a", "orders:\xff"} {
		require.True(t, key >= string(lower) && key < string(upper), key)
	}
	for _, key := range []string{"orders", "orders;", "ordersx:a", "order:a"} {
		require.False(t, key >= string(lower) && key < string(upper), key)
	}
	lower, upper = storekit.ListRange("")
	require.Empty(t, lower)
	require.Nil(t, upper, "every key")
	require.Equal(t, "orders:", storekit.ListPrefix("orders"))
	require.Empty(t, storekit.ListPrefix(""))
}

// A cursor reads back as the key it was written from, whatever its bytes;
// anything else is an invalid request.
func TestListCursor(t *testing.T) {
	for _, key := range []string{"a", "orders:o-1", "k\x00ey", "\xff\xfe", strings.Repeat("k", backends.MaxKeyBytes)} {
		got, err := storekit.ParseListCursor(storekit.ListCursor(key))
		require.NoError(t, err)
		require.Equal(t, key, got)
	}
	after, err := storekit.ParseListCursor("")
	require.NoError(t, err)
	require.Empty(t, after, "the first page")
	// "YR" decodes to "a" leniently, but ListCursor("a") is "YQ": a
	// cursor is read back only as ListCursor writes it.
	for _, bad := range []string{"not base64!", "YQ==", "YR", storekit.ListCursor(strings.Repeat("k", backends.MaxKeyBytes+1))} {
		_, err := storekit.ParseListCursor(bad)
		require.ErrorIs(t, err, backends.ErrInvalidRequest, bad)
		require.ErrorIs(t, err, backends.ErrInvalidCursor, bad)
	}
}

func TestValidateList(t *testing.T) {
	require.NoError(t, storekit.ValidateList(backends.ListRequest{Limit: 1}))
	require.NoError(t, storekit.ValidateList(backends.ListRequest{Limit: backends.MaxListLimit, State: backends.StateCompleted, Cursor: storekit.ListCursor("k")}))
	for name, req := range map[string]backends.ListRequest{
		"no limit":      {},
		"limit too big": {Limit: backends.MaxListLimit + 1},
		"unknown state": {Limit: 1, State: backends.StateCompleted + 1},
		"bad cursor":    {Limit: 1, Cursor: "!"},
	} {
		require.ErrorIs(t, storekit.ValidateList(req), backends.ErrInvalidRequest, name)
	}
}

// A cursor is good for its own namespace only, and for every namespace at
// once (an empty one); one of another namespace is refused, not answered
// with a page that is wrongly empty.
func TestValidateListCursorNamespace(t *testing.T) {
	cursor := storekit.ListCursor("orders:o-1")
	require.NoError(t, storekit.ValidateList(backends.ListRequest{Namespace: "orders", Limit: 1, Cursor: cursor}))
	require.NoError(t, storekit.ValidateList(backends.ListRequest{Limit: 1, Cursor: cursor}), "every namespace")
	for _, ns := range []string{"refunds", "order", "orders:o"} {
		err := storekit.ValidateList(backends.ListRequest{Namespace: ns, Limit: 1, Cursor: cursor})
		require.ErrorIs(t, err, backends.ErrInvalidCursor, ns)
		require.ErrorIs(t, err, backends.ErrInvalidRequest, ns)
	}
	err := storekit.ValidateList(backends.ListRequest{Limit: 0, Cursor: cursor})
	require.False(t, errors.Is(err, backends.ErrInvalidCursor), "a bad limit is not the cursor's fault: %v", err)
}

// records is a store's records by key, for Page to read.
type records map[string]backends.Record

func (rs records) read(calls *[]int) func(context.Context, []string) ([]backends.Record, error) {
	return func(_ context.Context, keys []string) ([]backends.Record, error) {
		*calls = append(*calls, len(keys))
		var out []backends.Record
		for _, k := range keys {
			if r, ok := rs[k]; ok {
				out = append(out, r)
			}
		}
		return out, nil
	}
}

// Paging through keys found in any order, some twice, some gone since,
// returns every record once, in key order, a full page at a time, and
// only those in the state asked for.
func TestPage(t *testing.T) {
	rs := records{}
	var scanned []string
	for i := range 100 {
		k := fmt.Sprintf("ns:%03d", i)
		st := backends.StateInProgress
		if i%3 == 0 {
			st = backends.StateCompleted
		}
		if i%10 != 7 { // gone since the scan
			rs[k] = backends.Record{Key: k, State: st}
		}
		scanned = append(scanned, k)
		if i%4 == 0 {
			scanned = append(scanned, k) // a scan may return a key twice
		}
	}
	for _, state := range []backends.State{0, backends.StateCompleted} {
		var got []string
		cursor := ""
		for pages := 0; ; pages++ {
			require.Less(t, pages, 100)
			keys := slices.Clone(scanned)
			rand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
			var calls []int
			page, err := storekit.Page(context.Background(), backends.ListRequest{Namespace: "ns", State: state, Limit: 7, Cursor: cursor},
				keys, 20, rs.read(&calls))
			require.NoError(t, err)
			for _, n := range calls {
				require.LessOrEqual(t, n, 20, "at most maxBatch keys a read")
			}
			for _, r := range page.Records {
				got = append(got, r.Key)
				if state != 0 {
					require.Equal(t, state, r.State)
				}
			}
			if page.Cursor == "" {
				require.Less(t, len(page.Records), 7, "no cursor only on a page that is not full")
				break
			}
			require.Len(t, page.Records, 7)
			cursor = page.Cursor
		}
		var want []string
		for k, r := range rs {
			if state == 0 || r.State == state {
				want = append(want, k)
			}
		}
		slices.Sort(want)
		require.Equal(t, want, got, "state %v: every record once, in order", state)
	}
}

func TestPageErrors(t *testing.T) {
	boom := errors.New("boom")
	_, err := storekit.Page(context.Background(), backends.ListRequest{Limit: 1}, []string{"a"}, 0,
		func(context.Context, []string) ([]backends.Record, error) { return nil, boom })
	require.ErrorIs(t, err, boom)
	_, err = storekit.Page(context.Background(), backends.ListRequest{Limit: 1, Cursor: "!"}, nil, 0, nil)
	require.ErrorIs(t, err, backends.ErrInvalidRequest)
}

func TestAddCount(t *testing.T) {
	var c backends.Counts
	t0 := time.Unix(1_700_000_000, 0)
	for _, r := range []struct {
		s  backends.State
		at time.Time
	}{
		{backends.StateInProgress, t0.Add(2 * time.Second)},
		{backends.StateExpired, t0}, // not in progress: never the oldest
		{backends.StateExpired, t0},
		{backends.StateInProgress, time.Time{}}, // acquired before stores kept the time
		{backends.StateInProgress, t0.Add(time.Second)},
		{backends.StateInProgress, t0.Add(3 * time.Second)},
		{backends.StateReleased, t0}, {backends.StateCompleted, t0}, {backends.StateCompleted, t0},
		{backends.StateCompleted, t0}, {0, t0}, {99, t0},
	} {
		storekit.AddCount(&c, r.s, r.at)
	}
	require.Equal(t, backends.Counts{InProgress: 4, Expired: 2, Released: 1, Completed: 3, OldestInProgress: t0.Add(time.Second)}, c)
	require.EqualValues(t, 10, c.Total())
}
