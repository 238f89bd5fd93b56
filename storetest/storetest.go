package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Fixture is what a store under test gives the suite.
type Fixture struct {
	// Store is the store under test. Required.
	Store backends.Store
	// Advance moves the store's clock forward by d. Nil means the store
	// uses a real clock and the suite sleeps instead.
	Advance func(d time.Duration)
	// Tick is the unit of time the suite builds short lease TTLs and waits
	// from. It must be well above the store's timing precision and round
	// trip. Defaults to 100ms.
	Tick time.Duration
	// Skew is how long past a lease's expiry, or past the end of a
	// record's retention, the store may still count the lease or the
	// record live: the margin of a store that judges time by its callers'
	// clocks (dynamostore's ClockSkew). The suite waits that much longer
	// before it expects either, and allows that much more in
	// AcquireResult.Remaining. Defaults to 0.
	Skew time.Duration
}

// Run runs the whole conformance suite against the stores that newFixture
// returns. newFixture is called once per test, from that test's goroutine;
// tests run in parallel.
func Run(t *testing.T, newFixture func(t *testing.T) Fixture) {
	t.Helper()
	start := func(t *testing.T) *suite {
		t.Parallel()
		f := newFixture(t)
		require.NotNil(t, f.Store, "Fixture.Store is required")
		if f.Tick <= 0 {
			f.Tick = 100 * time.Millisecond
		}
		return &suite{Fixture: f, prefix: uniquePrefix(t)}
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, start(t)) })
	}
	for _, tc := range listTests {
		t.Run(tc.name, func(t *testing.T) {
			s := start(t)
			l, ok := s.Store.(backends.Lister)
			if !ok {
				t.Skipf("%T does not implement backends.Lister", s.Store)
			}
			tc.fn(t, s, l)
		})
	}
	for _, d := range doors {
		for _, tc := range doorTests {
			t.Run(d.name+"/"+tc.name, func(t *testing.T) { tc.fn(t, start(t), d) })
		}
	}
	// The watch tests exist only for stores that can wake waiters: a
	// store without backends.Watcher is polled, which the tests above
	// cover.
	for _, tc := range watchTests {
		t.Run(tc.name, func(t *testing.T) {
			s := start(t)
			w, ok := s.Store.(backends.Watcher)
			if !ok {
				t.Skipf("%T does not implement backends.Watcher", s.Store)
			}
			tc.fn(t, s, w)
		})
	}
}

type suite struct {
	Fixture
	prefix   string
	owners   atomic.Int64
	advanced atomic.Int64 // how far sleep has moved the fixture's clock, in ns
}

// long is a lease TTL (and a retention) that never runs out during a
// test: a loaded machine has stretched a listing test past half a minute.
const long = time.Hour

func uniquePrefix(t *testing.T) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "storetest:" + t.Name() + ":" + hex.EncodeToString(b) + ":"
}

func (s *suite) key(name string) string { return s.prefix + name }

func (s *suite) owner() string { return fmt.Sprintf("owner-%d", s.owners.Add(1)) }

func (s *suite) wait(ticks float64) { s.sleep(time.Duration(ticks * float64(s.Tick))) }

// pastResolution is how far waitPast steps beyond a deadline so that a
// server clock of coarse resolution sees it passed too: Redis, for one,
// keeps a key until its expiry, in whole milliseconds, is strictly in the
// past, so a wait of exactly the retention can end 1ms too early by its
// clock.
const pastResolution = 5 * time.Millisecond

// waitPast waits ticks, the store's skew margin and pastResolution: long
// enough for a lease or retention of ticks to have run out by every clock.
func (s *suite) waitPast(ticks float64) {
	s.sleep(time.Duration(ticks*float64(s.Tick)) + s.Skew + pastResolution)
}

func (s *suite) sleep(d time.Duration) {
	if s.Advance != nil {
		s.advanced.Add(int64(d))
		s.Advance(d)
		return
	}
	time.Sleep(d)
}

// stopwatch measures time on the suite's clock: the fixture's, where the
// suite moves it, the monotonic clock otherwise. Started before one store
// call and read after a later one, it shows at least as much time as the
// store can have seen pass between the two, wherever within each call it
// took the time (its server's clock, or its caller's before the round
// trip).
type stopwatch struct {
	s        *suite
	start    time.Time
	advanced int64
}

func (s *suite) stopwatch() stopwatch {
	return stopwatch{s: s, start: time.Now(), advanced: s.advanced.Load()}
}

// late reports whether d may have passed by the store's clock since w
// started: then a lease or retention of d started within the first call
// may have run out by the second, rightly. The suite sleeps at least as
// long as it asks but can be paused anywhere for any time on a loaded
// machine, so a check that a lease or record is still there counts only
// when it was not late.
func (w stopwatch) late(d time.Duration) bool {
	elapsed := time.Since(w.start)
	if w.s.Advance != nil {
		elapsed = time.Duration(w.s.advanced.Load() - w.advanced)
	}
	return elapsed+pastResolution >= d
}

// attempts bounds how many times untilInTime tries a check.
const attempts = 5

// untilInTime runs try, each time with a key of its own, until try
// returns false: its check was made. try returns true when its check
// could not be made because the suite ran late (stopwatch.late); five
// late runs in a row fail the test.
func (s *suite) untilInTime(t *testing.T, try func(key string) (late bool)) (key string) {
	t.Helper()
	for i := 1; ; i++ {
		key = s.key(fmt.Sprint("k", i))
		if !try(key) {
			return key
		}
		require.Less(t, i, attempts, "each of %d tries ran too late for the check to tell", attempts)
		t.Logf("try %d ran too late for the check to tell; trying again", i)
	}
}

func (s *suite) ticks(n float64) time.Duration { return time.Duration(n * float64(s.Tick)) }

// callTimeout bounds a store call of the suite: far above any store's
// round trip, so that only a call that hangs fails it.
const callTimeout = 30 * time.Second

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return c
}

// originOf is the origin the suite gives an acquisition by owner, in the
// middleware's form: every record the suite makes keeps one.
func originOf(owner string) string {
	if o := "message_uuid=" + owner + " handler=storetest"; len(o) <= backends.MaxOriginBytes {
		return o
	}
	return fmt.Sprintf("handler=storetest owner of %d bytes", len(owner))
}

func (s *suite) acquire(t *testing.T, key, owner string, ttl time.Duration) backends.AcquireResult {
	t.Helper()
	return s.acquireFrom(t, key, owner, originOf(owner), ttl)
}

// acquireFrom acquires with the given origin.
func (s *suite) acquireFrom(t *testing.T, key, owner, origin string, ttl time.Duration) backends.AcquireResult {
	t.Helper()
	res, err := s.Store.Acquire(ctx(t), backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: ttl, Retention: long, Origin: origin})
	require.NoError(t, err)
	return res
}

func (s *suite) mustAcquire(t *testing.T, key, owner string, ttl time.Duration) backends.Lease {
	t.Helper()
	res := s.acquire(t, key, owner, ttl)
	require.Equal(t, backends.StatusAcquired, res.Status, "acquire %q by %s", key, owner)
	require.Equal(t, key, res.Lease.Key)
	require.Equal(t, owner, res.Lease.Owner)
	require.Positive(t, res.Lease.Token)
	require.Positive(t, res.Lease.Attempt)
	return res.Lease
}

func (s *suite) requireLost(t *testing.T, l backends.Lease) {
	t.Helper()
	c := ctx(t)
	require.ErrorIs(t, s.Store.Renew(c, l, long), backends.ErrLeaseLost, "renew")
	require.ErrorIs(t, s.Store.Complete(c, l, []byte("x")), backends.ErrLeaseLost, "complete")
	require.ErrorIs(t, s.Store.Release(c, l), backends.ErrLeaseLost, "release")
}

func (s *suite) inspect(t *testing.T, key string) backends.Record {
	t.Helper()
	rec, err := s.Store.Inspect(ctx(t), key)
	require.NoError(t, err)
	require.Equal(t, key, rec.Key)
	return rec
}

var tests = []struct {
	name string
	fn   func(t *testing.T, s *suite)
}{
	{"AcquireFreshKey", testAcquireFreshKey},
	{"InProgressForOthers", testInProgressForOthers},
	{"ConcurrentAcquireOneWinner", testConcurrentAcquireOneWinner},
	{"ConcurrentAcquireManyKeys", testConcurrentAcquireManyKeys},
	{"ConcurrentTakeoverOneWinner", testConcurrentTakeoverOneWinner},
	{"AtMostOneHolder", testAtMostOneHolder},
	{"Reentrant", testReentrant},
	{"TakeoverAfterExpiry", testTakeoverAfterExpiry},
	{"ExpiredLeaseStillOwnersUntilTakenOver", testExpiredNotTakenOver},
	{"ReleaseByNonOwner", testReleaseByNonOwner},
	{"ReleaseThenAcquire", testReleaseThenAcquire},
	{"FencingTokenStrictlyIncreases", testFencingTokenStrictlyIncreases},
	{"CompletedWithOutput", testCompletedWithOutput},
	{"CompletedUntilRetentionEnds", testCompletedUntilRetentionEnds},
	{"ReleasedRecordKeptForRetention", testReleasedRecordKept},
	{"Fingerprint", testFingerprint},
	{"RenewExtends", testRenewExtends},
	{"InspectAndDelete", testInspectAndDelete},
	{"OddKeys", testOddKeys},
	{"LargeOutput", testLargeOutput},
	{"InvalidRequests", testInvalidRequests},
	{"Limits", testLimits},
	{"Owners", testOwners},
	{"PoolSize", testPoolSize},
	{"CancelledContext", testCancelledContext},
	{"Origin", testOrigin},
	{"Origins", testOrigins},
	{"AcquiredAt", testAcquiredAt},
	{"RecordFields", testRecordFields},
}

func testAcquireFreshKey(t *testing.T, s *suite) {
	key := s.key("k")
	res := s.acquire(t, key, s.owner(), long)
	require.Equal(t, backends.StatusAcquired, res.Status)
	require.Equal(t, 1, res.Lease.Attempt)
	require.Positive(t, res.Lease.Token)
	require.False(t, res.Lease.Takeover)
	require.False(t, res.Reentrant)
	require.Nil(t, res.Fingerprint)

	rec := s.inspect(t, key)
	require.Equal(t, backends.StateInProgress, rec.State)
	require.Equal(t, res.Lease.Owner, rec.Owner)
	require.Equal(t, res.Lease.Token, rec.Token)
	require.Equal(t, 1, rec.Attempt)
}

func testInProgressForOthers(t *testing.T, s *suite) {
	ttl := s.ticks(100)
	s.untilInTime(t, func(key string) bool {
		w := s.stopwatch()
		s.mustAcquire(t, key, s.owner(), ttl)
		res := s.acquire(t, key, s.owner(), ttl)
		if (res.Status != backends.StatusInProgress || res.Remaining <= 0) && w.late(ttl) {
			return true
		}
		require.Equal(t, backends.StatusInProgress, res.Status)
		require.Positive(t, res.Remaining)
		require.LessOrEqual(t, res.Remaining, ttl+s.Skew)
		require.Zero(t, res.Lease, "an in-progress result carries no lease")
		return false
	})
}

// acquireAtOnce acquires every key in keys (repeats allowed), each from its
// own goroutine and with its own owner, all released at the same moment,
// and returns the results in the order of keys.
func (s *suite) acquireAtOnce(t *testing.T, keys []string) []backends.AcquireResult {
	t.Helper()
	results := make([]backends.AcquireResult, len(keys))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, key := range keys {
		owner := s.owner()
		wg.Go(func() {
			<-start
			res, err := s.Store.Acquire(context.Background(), backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: long, Retention: long, Origin: originOf(owner)})
			if err != nil {
				t.Error(err)
			}
			results[i] = res
		})
	}
	close(start)
	wg.Wait()
	return results
}

func repeat(key string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = key
	}
	return keys
}

func testConcurrentAcquireOneWinner(t *testing.T, s *suite) {
	const n = 50
	outcomes := map[backends.Status]int{}
	for _, res := range s.acquireAtOnce(t, repeat(s.key("k"), n)) {
		outcomes[res.Status]++
	}
	require.Equal(t, map[backends.Status]int{backends.StatusAcquired: 1, backends.StatusInProgress: n - 1}, outcomes)
}

func testConcurrentAcquireManyKeys(t *testing.T, s *suite) {
	const keys, perKey = 20, 10
	var all []string
	for k := range keys {
		all = append(all, repeat(s.key(fmt.Sprint(k)), perKey)...)
	}
	winners := map[string]int{}
	for i, res := range s.acquireAtOnce(t, all) {
		if res.Status == backends.StatusAcquired {
			winners[all[i]]++
		}
	}
	require.Len(t, winners, keys)
	for k, n := range winners {
		require.Equal(t, 1, n, "key %s", k)
	}
}

func testConcurrentTakeoverOneWinner(t *testing.T, s *suite) {
	key := s.key("k")
	first := s.mustAcquire(t, key, s.owner(), s.ticks(1))
	s.waitPast(2)

	var winners []backends.Lease
	for _, res := range s.acquireAtOnce(t, repeat(key, 50)) {
		if res.Status == backends.StatusAcquired {
			winners = append(winners, res.Lease)
		}
	}
	require.Len(t, winners, 1)
	require.True(t, winners[0].Takeover)
	require.Greater(t, winners[0].Token, first.Token)
	require.Equal(t, 2, winners[0].Attempt)
}

// testAtMostOneHolder runs workers that repeatedly acquire a few hot keys,
// hold them briefly and then complete or release them, and checks that no
// two workers ever believe they hold the same key at once and that each
// key's tokens only go up.
func testAtMostOneHolder(t *testing.T, s *suite) {
	const workers, keys, rounds = 16, 3, 40
	holders := make([]atomic.Int32, keys)
	lastToken := make([]atomic.Int64, keys)
	completions := make([]atomic.Int32, keys)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var retries retrier
			for i := range rounds {
				k := (w + i) % keys
				key := s.key(fmt.Sprint(k))
				res, err := s.Store.Acquire(context.Background(), backends.AcquireRequest{Key: key, Owner: s.owner(), LeaseTTL: long, Retention: long})
				if retries.retry(err) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if res.Status != backends.StatusAcquired {
					continue
				}
				if h := holders[k].Add(1); h != 1 {
					t.Errorf("key %d has %d holders", k, h)
				}
				if prev := lastToken[k].Swap(res.Lease.Token); res.Lease.Token <= prev {
					t.Errorf("key %d: token %d after %d", k, res.Lease.Token, prev)
				}
				holders[k].Add(-1)
				// Release most of the time so the key stays contended; complete
				// each key only near the end.
				if i >= rounds-keys {
					err = s.Store.Complete(context.Background(), res.Lease, nil)
					completions[k].Add(1)
				} else {
					err = s.Store.Release(context.Background(), res.Lease)
				}
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for k := range keys {
		require.LessOrEqual(t, completions[k].Load(), int32(1), "key %d completed more than once", k)
	}
}

func testReentrant(t *testing.T, s *suite) {
	key, owner := s.key("k"), s.owner()
	first := s.mustAcquire(t, key, owner, s.ticks(3))
	s.wait(2)
	again := s.acquire(t, key, owner, long)
	require.Equal(t, backends.StatusAcquired, again.Status)
	require.True(t, again.Reentrant)
	require.False(t, again.Lease.Takeover)
	require.Equal(t, first.Token, again.Lease.Token)
	require.Equal(t, first.Attempt, again.Lease.Attempt)

	// The re-entrant acquire extended the lease: two more ticks in, the
	// original lease has run out, the extended one has not. (Waits only
	// ever run late, which makes the first half surer and leaves the
	// second untouched.)
	s.wait(2)
	other := s.acquire(t, key, s.owner(), long)
	require.Equal(t, backends.StatusInProgress, other.Status)

	// Both values of the lease work, since they are the same lease.
	require.NoError(t, s.Store.Complete(ctx(t), first, nil))
}

func testTakeoverAfterExpiry(t *testing.T, s *suite) {
	key := s.key("k")
	old := s.mustAcquire(t, key, s.owner(), s.ticks(1))
	s.waitPast(2)
	require.Equal(t, backends.StateExpired, s.inspect(t, key).State)

	res := s.acquire(t, key, s.owner(), long)
	require.Equal(t, backends.StatusAcquired, res.Status)
	require.True(t, res.Lease.Takeover)
	require.False(t, res.Reentrant)
	require.Greater(t, res.Lease.Token, old.Token)
	require.Equal(t, 2, res.Lease.Attempt)

	s.requireLost(t, old)

	rec := s.inspect(t, key)
	require.Equal(t, backends.StateInProgress, rec.State, "the old holder's calls changed nothing")
	require.Equal(t, res.Lease.Owner, rec.Owner)
	require.Equal(t, res.Lease.Token, rec.Token)
	require.NoError(t, s.Store.Complete(ctx(t), res.Lease, nil))
}

func testExpiredNotTakenOver(t *testing.T, s *suite) {
	key := s.key("k")
	l := s.mustAcquire(t, key, s.owner(), s.ticks(1))
	s.wait(2)
	require.NoError(t, s.Store.Renew(ctx(t), l, long), "nobody took the lease over: it is still the owner's")
	require.NoError(t, s.Store.Complete(ctx(t), l, []byte("done")))
	res := s.acquire(t, key, s.owner(), long)
	require.Equal(t, backends.StatusCompleted, res.Status)
}

func testReleaseByNonOwner(t *testing.T, s *suite) {
	key := s.key("k")
	l := s.mustAcquire(t, key, s.owner(), long)

	other := l
	other.Owner = s.owner()
	require.ErrorIs(t, s.Store.Release(ctx(t), other), backends.ErrLeaseLost)
	stale := l
	stale.Token--
	require.ErrorIs(t, s.Store.Release(ctx(t), stale), backends.ErrLeaseLost)
	require.ErrorIs(t, s.Store.Complete(ctx(t), stale, nil), backends.ErrLeaseLost)
	require.ErrorIs(t, s.Store.Renew(ctx(t), other, long), backends.ErrLeaseLost)

	res := s.acquire(t, key, s.owner(), long)
	require.Equal(t, backends.StatusInProgress, res.Status, "the holder's lease survived")
	rec := s.inspect(t, key)
	require.Equal(t, l.Owner, rec.Owner)
	require.Equal(t, l.Token, rec.Token)
}

func testReleaseThenAcquire(t *testing.T, s *suite) {
	key := s.key("k")
	first := s.mustAcquire(t, key, s.owner(), long)
	require.NoError(t, s.Store.Release(ctx(t), first))
	require.Equal(t, backends.StateReleased, s.inspect(t, key).State)
	require.ErrorIs(t, s.Store.Release(ctx(t), first), backends.ErrLeaseLost, "a second release finds nothing to release")

	res := s.acquire(t, key, s.owner(), long)
	require.Equal(t, backends.StatusAcquired, res.Status)
	require.False(t, res.Lease.Takeover)
	require.Greater(t, res.Lease.Token, first.Token)
	require.Equal(t, 2, res.Lease.Attempt)
	s.requireLost(t, first)
}

func testFencingTokenStrictlyIncreases(t *testing.T, s *suite) {
	key := s.key("k")
	var last int64
	for i := range 8 {
		ttl := long
		if i%2 == 1 {
			ttl = s.ticks(1)
		}
		l := s.mustAcquire(t, key, s.owner(), ttl)
		require.Greater(t, l.Token, last, "round %d", i)
		require.Equal(t, i+1, l.Attempt)
		last = l.Token
		if i%2 == 0 {
			require.NoError(t, s.Store.Release(ctx(t), l))
		} else {
			s.waitPast(2) // let it expire: the next acquire is a takeover
		}
	}
}

func testCompletedWithOutput(t *testing.T, s *suite) {
	key := s.key("k")
	l := s.mustAcquire(t, key, s.owner(), long)
	out := []byte("output\x00with\xffodd bytes")
	require.NoError(t, s.Store.Complete(ctx(t), l, out))

	res := s.acquire(t, key, s.owner(), long)
	require.Equal(t, backends.StatusCompleted, res.Status)
	require.Equal(t, out, res.Output)
	require.False(t, res.CompletedAt.IsZero())
	require.Zero(t, res.Lease)

	rec := s.inspect(t, key)
	require.Equal(t, backends.StateCompleted, rec.State)
	require.Equal(t, out, rec.Output)
	require.False(t, rec.CompletedAt.IsZero())
	s.requireLost(t, l)

	// No output is stored as none.
	key2 := s.key("nil-output")
	l2 := s.mustAcquire(t, key2, s.owner(), long)
	require.NoError(t, s.Store.Complete(ctx(t), l2, nil))
	res2 := s.acquire(t, key2, s.owner(), long)
	require.Equal(t, backends.StatusCompleted, res2.Status)
	require.Empty(t, res2.Output)
}

// testCompletedUntilRetentionEnds checks that a completed record is kept
// for the retention given at Acquire, counted from the completion.
func testCompletedUntilRetentionEnds(t *testing.T, s *suite) {
	retention := s.ticks(20)
	key := s.untilInTime(t, func(key string) bool {
		first, err := s.Store.Acquire(ctx(t), backends.AcquireRequest{Key: key, Owner: s.owner(), LeaseTTL: long, Retention: retention})
		require.NoError(t, err)
		require.Equal(t, backends.StatusAcquired, first.Status)
		// The retention runs from the completion: 16 + 6 ticks after the
		// acquisition the record is still there, though 22 > 20. A late
		// wait before the completion only proves more; a pause from the
		// completion to the check as long as the retention proves nothing.
		s.wait(16)
		w := s.stopwatch()
		require.NoError(t, s.Store.Complete(ctx(t), first.Lease, []byte("out")))
		s.wait(6)
		status := s.acquire(t, key, s.owner(), long).Status
		if status != backends.StatusCompleted && w.late(retention) {
			return true
		}
		require.Equal(t, backends.StatusCompleted, status, "kept for the retention after completion")
		return false
	})
	s.waitPast(16)
	_, err := s.Store.Inspect(ctx(t), key)
	require.ErrorIs(t, err, backends.ErrNotFound, "a completed record past its retention is gone")
	res := s.acquire(t, key, s.owner(), long)
	require.Equal(t, backends.StatusAcquired, res.Status)
	require.Equal(t, 1, res.Lease.Attempt, "a new record")
	require.Empty(t, res.Output)
}

func testReleasedRecordKept(t *testing.T, s *suite) {
	retention := s.ticks(10)
	key := s.untilInTime(t, func(key string) bool {
		res, err := s.Store.Acquire(ctx(t), backends.AcquireRequest{Key: key, Owner: s.owner(), LeaseTTL: long, Retention: retention})
		require.NoError(t, err)
		w := s.stopwatch()
		require.NoError(t, s.Store.Release(ctx(t), res.Lease))
		rec, err := s.Store.Inspect(ctx(t), key)
		if (err != nil || rec.State != backends.StateReleased) && w.late(retention) {
			return true
		}
		require.NoError(t, err)
		require.Equal(t, backends.StateReleased, rec.State)
		require.Equal(t, res.Lease.Token, rec.Token, "the released record keeps its token")
		return false
	})
	s.waitPast(10)
	_, err := s.Store.Inspect(ctx(t), key)
	require.ErrorIs(t, err, backends.ErrNotFound, "a released record past its retention is gone")
}

func testFingerprint(t *testing.T, s *suite) {
	key := s.key("k")
	fp1, fp2 := []byte("sha256:aaaa"), []byte("sha256:bbbb")
	c := ctx(t)
	res, err := s.Store.Acquire(c, backends.AcquireRequest{Key: key, Owner: s.owner(), LeaseTTL: long, Retention: long, Fingerprint: fp1})
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, res.Status)
	require.Equal(t, fp1, res.Fingerprint)

	dup, err := s.Store.Acquire(c, backends.AcquireRequest{Key: key, Owner: s.owner(), LeaseTTL: long, Retention: long, Fingerprint: fp2})
	require.NoError(t, err)
	require.Equal(t, backends.StatusInProgress, dup.Status)
	require.Equal(t, fp1, dup.Fingerprint, "the first fingerprint is kept")

	require.NoError(t, s.Store.Complete(c, res.Lease, nil))
	done, err := s.Store.Acquire(c, backends.AcquireRequest{Key: key, Owner: s.owner(), LeaseTTL: long, Retention: long, Fingerprint: fp2})
	require.NoError(t, err)
	require.Equal(t, backends.StatusCompleted, done.Status)
	require.Equal(t, fp1, done.Fingerprint)
	require.Equal(t, fp1, s.inspect(t, key).Fingerprint)

	// A record acquired without a fingerprint adopts the first one given.
	key2 := s.key("late")
	s.mustAcquire(t, key2, s.owner(), long)
	late, err := s.Store.Acquire(c, backends.AcquireRequest{Key: key2, Owner: s.owner(), LeaseTTL: long, Retention: long, Fingerprint: fp2})
	require.NoError(t, err)
	require.Equal(t, fp2, late.Fingerprint)
}

func testRenewExtends(t *testing.T, s *suite) {
	var l backends.Lease
	key := s.untilInTime(t, func(key string) bool {
		l = s.mustAcquire(t, key, s.owner(), s.ticks(3))
		s.wait(2)
		w := s.stopwatch()
		require.NoError(t, s.Store.Renew(ctx(t), l, s.ticks(30)))
		s.wait(2) // four ticks after acquire: past the original lease
		res := s.acquire(t, key, s.owner(), long)
		rec := s.inspect(t, key)
		// More than 3 of the 30 ticks left: fewer than 27 passed.
		if (res.Status != backends.StatusInProgress || res.Remaining <= s.ticks(3) || rec.State != backends.StateInProgress) && w.late(s.ticks(27)) {
			return true
		}
		require.Equal(t, backends.StatusInProgress, res.Status)
		require.Greater(t, res.Remaining, s.ticks(3), "the renewed lease outlasts the original one")
		require.Equal(t, backends.StateInProgress, rec.State)
		return false
	})

	// Renew can also shorten a lease; the holder decides.
	require.NoError(t, s.Store.Renew(ctx(t), l, s.ticks(1)))
	s.waitPast(2)
	require.Equal(t, backends.StatusAcquired, s.acquire(t, key, s.owner(), long).Status)
	s.requireLost(t, l)
}

func testInspectAndDelete(t *testing.T, s *suite) {
	key := s.key("k")
	c := ctx(t)
	_, err := s.Store.Inspect(c, key)
	require.ErrorIs(t, err, backends.ErrNotFound)
	require.ErrorIs(t, s.Store.Delete(c, key), backends.ErrNotFound)

	l := s.mustAcquire(t, key, s.owner(), long)
	rec := s.inspect(t, key)
	require.Equal(t, backends.StateInProgress, rec.State)
	require.Equal(t, l.Owner, rec.Owner)
	require.Equal(t, l.Token, rec.Token)
	require.Equal(t, 1, rec.Attempt)
	require.True(t, rec.LeaseExpiresAt.After(rec.ExpiresAt.Add(-long-time.Minute)), "lease expiry is on the store's clock")
	require.False(t, rec.ExpiresAt.Before(rec.LeaseExpiresAt), "the record outlives its lease")

	require.NoError(t, s.Store.Delete(c, key))
	_, err = s.Store.Inspect(c, key)
	require.ErrorIs(t, err, backends.ErrNotFound)
	require.ErrorIs(t, s.Store.Delete(c, key), backends.ErrNotFound)
	require.ErrorIs(t, s.Store.Complete(c, l, nil), backends.ErrLeaseLost, "the deleted lease is lost")
	require.Equal(t, backends.StatusAcquired, s.acquire(t, key, s.owner(), long).Status)
}

// OddKeys returns the keys the suite requires every store to keep apart:
// each must round-trip and none may collide with another. A store's own
// tests may use them too; each call returns a fresh slice.
func OddKeys() []string { return slices.Clone(oddKeys) }

var oddKeys = []string{
	`quote"d`, `single'quote`, "with space", "tab\tand\nnewline", `back\slash`,
	"unicode-ключ-键-🔑", "nul\x00byte", "nul\x00", "nul", "{hash}tag", "*glob?[x]",
	"%s%d%%", "'; DROP TABLE x; --", "\xff\xfe invalid utf8", strings.Repeat("long", 128),
}

func testOddKeys(t *testing.T, s *suite) {
	leases := make(map[string]backends.Lease, len(oddKeys))
	for _, k := range oddKeys {
		key := s.key(k)
		leases[key] = s.mustAcquire(t, key, s.owner(), long)
	}
	for key, l := range leases {
		require.NoError(t, s.Store.Complete(ctx(t), l, []byte(key)), "key %q", key)
	}
	for key := range leases {
		res := s.acquire(t, key, s.owner(), long)
		require.Equal(t, backends.StatusCompleted, res.Status, "key %q", key)
		require.Equal(t, []byte(key), res.Output, "key %q kept apart from the others", key)
		require.Equal(t, key, s.inspect(t, key).Key)
	}
}

// MinOutputLimit is the lowest output limit a store may declare
// ([backends.OutputLimiter]); a store without one must hold 1 MiB, the
// middleware's default MaxOutputBytes.
const MinOutputLimit = 64 << 10

// testLargeOutput checks that the largest output the store promises
// round-trips: 1 MiB, or the store's own limit, one byte over which is
// refused without touching the lease.
func testLargeOutput(t *testing.T, s *suite) {
	size := 1 << 20
	limit := 0
	if ol, ok := s.Store.(backends.OutputLimiter); ok {
		limit = ol.MaxOutputBytes()
	}
	if limit > 0 {
		require.GreaterOrEqual(t, limit, MinOutputLimit, "the store's output limit")
		size = limit
	}
	key := s.key("k")
	out := bytes.Repeat([]byte{0, 1, 2, 0xff}, size/4+1)[:size]
	l := s.mustAcquire(t, key, s.owner(), long)
	if limit > 0 {
		err := s.Store.Complete(ctx(t), l, append(out, 7))
		require.ErrorIs(t, err, backends.ErrInvalidRequest, "an output one byte over the store's limit")
		require.Equal(t, backends.StateInProgress, s.inspect(t, key).State, "the refused completion changed nothing")
	}
	require.NoError(t, s.Store.Complete(ctx(t), l, out))
	res := s.acquire(t, key, s.owner(), long)
	require.Equal(t, backends.StatusCompleted, res.Status)
	require.True(t, bytes.Equal(out, res.Output), "an output of %d bytes round-trips", size)
}

func testInvalidRequests(t *testing.T, s *suite) {
	c := ctx(t)
	key := s.key("k")
	for name, req := range map[string]backends.AcquireRequest{
		"empty key":          {Owner: "o", LeaseTTL: long},
		"empty owner":        {Key: key, LeaseTTL: long},
		"zero ttl":           {Key: key, Owner: "o"},
		"negative ttl":       {Key: key, Owner: "o", LeaseTTL: -time.Second},
		"negative retention": {Key: key, Owner: "o", LeaseTTL: long, Retention: -time.Second},
	} {
		_, err := s.Store.Acquire(c, req)
		require.ErrorIs(t, err, backends.ErrInvalidRequest, name)
	}
	_, err := s.Store.Inspect(c, key)
	require.ErrorIs(t, err, backends.ErrNotFound, "invalid requests changed nothing")

	l := s.mustAcquire(t, key, s.owner(), long)
	require.ErrorIs(t, s.Store.Renew(c, l, 0), backends.ErrInvalidRequest)
	require.ErrorIs(t, s.Store.Release(c, backends.Lease{Key: key}), backends.ErrInvalidRequest)
	require.Equal(t, backends.StateInProgress, s.inspect(t, key).State)
}

// testLimits checks the bounds of the contract: keys of MaxKeyBytes
// arbitrary bytes, fingerprints of MaxFingerprintBytes and durations of
// MaxDuration are served as any other;
// one byte or nanosecond more is an invalid request, refused before the
// server is asked, and changes nothing.
func testLimits(t *testing.T, s *suite) {
	c := ctx(t)
	longKey := s.key("")
	for i := 0; len(longKey) < backends.MaxKeyBytes; i++ {
		longKey += string(rune(0x80 + i%0x700))
	}
	longKey = longKey[:backends.MaxKeyBytes]
	l := s.mustAcquire(t, longKey, s.owner(), long)
	require.NoError(t, s.Store.Complete(c, l, []byte("out")))
	require.Equal(t, backends.StatusCompleted, s.acquire(t, longKey, s.owner(), long).Status)
	_, err := s.Store.Acquire(c, backends.AcquireRequest{Key: longKey + "x", Owner: s.owner(), LeaseTTL: long, Retention: long})
	require.ErrorIs(t, err, backends.ErrInvalidRequest, "a key over MaxKeyBytes")

	// The longest lease and retention: a second owner finds the key in
	// progress with (about) the whole lease left, and a completed record
	// is kept, not written already expired.
	key := s.key("max")
	res, err := s.Store.Acquire(c, backends.AcquireRequest{Key: key, Owner: s.owner(), LeaseTTL: backends.MaxDuration, Retention: backends.MaxDuration})
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, res.Status)
	other := s.acquire(t, key, s.owner(), long)
	require.Equal(t, backends.StatusInProgress, other.Status)
	require.Greater(t, other.Remaining, backends.MaxDuration-time.Hour)
	require.NoError(t, s.Store.Renew(c, res.Lease, backends.MaxDuration))
	rec := s.inspect(t, key)
	require.Equal(t, backends.StateInProgress, rec.State)
	require.Greater(t, rec.ExpiresAt.Sub(rec.LeaseExpiresAt), backends.MaxDuration-time.Hour, "kept for the retention after the lease")
	require.NoError(t, s.Store.Complete(c, res.Lease, nil))
	s.wait(1)
	require.Equal(t, backends.StatusCompleted, s.acquire(t, key, s.owner(), long).Status)
	rec = s.inspect(t, key)
	require.Greater(t, rec.ExpiresAt.Sub(rec.CompletedAt), backends.MaxDuration-time.Hour, "kept for the retention after completion")

	over := backends.MaxDuration + 1
	key2 := s.key("over")
	for name, req := range map[string]backends.AcquireRequest{
		"lease TTL over MaxDuration": {Key: key2, Owner: s.owner(), LeaseTTL: over, Retention: long},
		"retention over MaxDuration": {Key: key2, Owner: s.owner(), LeaseTTL: long, Retention: over},
		"largest duration":           {Key: key2, Owner: s.owner(), LeaseTTL: math.MaxInt64, Retention: math.MaxInt64},
	} {
		_, err := s.Store.Acquire(c, req)
		require.ErrorIs(t, err, backends.ErrInvalidRequest, name)
	}
	l2 := s.mustAcquire(t, key2, s.owner(), long)
	require.ErrorIs(t, s.Store.Renew(c, l2, over), backends.ErrInvalidRequest)
	require.Equal(t, backends.StateInProgress, s.inspect(t, key2).State, "refused calls changed nothing")

	// Inspect and Delete refuse a key no record can have, as Acquire does,
	// before the server is asked; a valid key without a record is not
	// found.
	for name, k := range map[string]string{"empty key": "", "key over MaxKeyBytes": longKey + "x"} {
		_, err := s.Store.Inspect(c, k)
		require.ErrorIs(t, err, backends.ErrInvalidRequest, "Inspect: %s", name)
		require.ErrorIs(t, s.Store.Delete(c, k), backends.ErrInvalidRequest, "Delete: %s", name)
	}
	absent := s.key("absent")
	_, err = s.Store.Inspect(c, absent)
	require.ErrorIs(t, err, backends.ErrNotFound)
	require.ErrorIs(t, s.Store.Delete(c, absent), backends.ErrNotFound)

	// The longest fingerprint is kept and returned whole, whatever the
	// server's mode (a MySQL BLOB in non-strict mode would cut it
	// silently); one byte more is an invalid request.
	fp := make([]byte, backends.MaxFingerprintBytes)
	for i := range fp {
		fp[i] = byte(i*7 + 1)
	}
	fpKey := s.key("fp")
	res, err = s.Store.Acquire(c, backends.AcquireRequest{Key: fpKey, Owner: s.owner(), LeaseTTL: long, Retention: long, Fingerprint: fp})
	require.NoError(t, err)
	require.Equal(t, fp, res.Fingerprint, "the longest fingerprint, whole")
	require.Equal(t, fp, s.inspect(t, fpKey).Fingerprint)
	again, err := s.Store.Acquire(c, backends.AcquireRequest{Key: fpKey, Owner: s.owner(), LeaseTTL: long, Retention: long, Fingerprint: fp})
	require.NoError(t, err)
	require.Equal(t, backends.StatusInProgress, again.Status)
	require.Equal(t, fp, again.Fingerprint)
	_, err = s.Store.Acquire(c, backends.AcquireRequest{Key: s.key("fp-over"), Owner: s.owner(), LeaseTTL: long, Retention: long, Fingerprint: append(fp, 0)})
	require.ErrorIs(t, err, backends.ErrInvalidRequest, "a fingerprint over MaxFingerprintBytes")
}

// testOwners checks what an owner may be: up to MaxOwnerBytes of UTF-8
// text without NUL, kept exactly; anything else is an invalid request in
// every store alike.
func testOwners(t *testing.T, s *suite) {
	c := ctx(t)
	longest := strings.Repeat("é", backends.MaxOwnerBytes/2) + "x" // 255 bytes
	require.Len(t, longest, backends.MaxOwnerBytes)
	for _, owner := range []string{longest, "ünïcødé-🔑", `quote"'; --`} {
		key := s.key(owner)
		l := s.mustAcquire(t, key, owner, long)
		require.Equal(t, owner, s.inspect(t, key).Owner)
		require.NoError(t, s.Store.Renew(c, l, long))
		require.NoError(t, s.Store.Complete(c, l, nil))
	}
	key := s.key("bad")
	for name, owner := range map[string]string{
		"invalid UTF-8":  "owner-\xff",
		"NUL":            "own\x00er",
		"over the limit": longest + "y",
	} {
		_, err := s.Store.Acquire(c, backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: long, Retention: long})
		require.ErrorIs(t, err, backends.ErrInvalidRequest, name)
		bad := backends.Lease{Key: key, Owner: owner, Token: 1}
		require.ErrorIs(t, s.Store.Renew(c, bad, long), backends.ErrInvalidRequest, name)
		require.ErrorIs(t, s.Store.Complete(c, bad, nil), backends.ErrInvalidRequest, name)
		require.ErrorIs(t, s.Store.Release(c, bad), backends.ErrInvalidRequest, name)
	}
	_, err := s.Store.Inspect(c, key)
	require.ErrorIs(t, err, backends.ErrNotFound, "invalid owners changed nothing")
}

// testPoolSize checks a store that reports its pool size
// ([backends.PoolSizer]): the size is not negative, and more concurrent
// calls than that are queued by its client, not refused.
func testPoolSize(t *testing.T, s *suite) {
	ps, ok := s.Store.(backends.PoolSizer)
	if !ok {
		t.Skipf("%T does not implement backends.PoolSizer, an optional capability", s.Store)
	}
	n := ps.PoolSize()
	require.GreaterOrEqual(t, n, 0)
	keys := make([]string, min(2*n+1, 64))
	for i := range keys {
		keys[i] = s.key(fmt.Sprint(i))
	}
	for i, res := range s.acquireAtOnce(t, keys) {
		require.Equal(t, backends.StatusAcquired, res.Status, "key %d of %d concurrent calls", i, len(keys))
	}
}

func testCancelledContext(t *testing.T, s *suite) {
	key := s.key("k")
	c, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Store.Acquire(c, backends.AcquireRequest{Key: key, Owner: s.owner(), LeaseTTL: long, Retention: long})
	require.Error(t, err)
	require.True(t, errors.Is(err, context.Canceled), "got %v", err)
	_, err = s.Store.Inspect(ctx(t), key)
	require.ErrorIs(t, err, backends.ErrNotFound, "a cancelled acquire took nothing")
}
