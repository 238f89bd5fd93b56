package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Race is the acquisition race every store runs: Racers goroutines, each
// with its own store (its own client, as separate processes have), race
// for the same few keys over and over. Each winner applies its key's
// effect through a fenced [Sink] and, most times, releases the key, so the
// next round races again; one time in eight it walks away without
// releasing, and the lease is taken over once it expires.
//
// Run fails the test if a winner holds a token not above every earlier
// one's, if two holders of a key overlap, or if the sink refuses a holder,
// while that holder is within its lease: only a holder that paused past
// its lease (which a loaded machine can make happen) may meet another. It
// fails the test, too, on a store error, except that a racer retries an
// Acquire that failed as a store may under contention (see retrier).
type Race struct {
	// Racers is how many goroutines race, Keys how many keys they race
	// for, and Wins how many acquisitions the race runs to.
	Racers, Keys, Wins int
	// LeaseTTL is the winners' lease, which a winner that walks away
	// leaves to run out.
	LeaseTTL time.Duration
	// Store returns racer i's store.
	Store func(t testing.TB, i int) backends.Store
}

// Run runs the race.
func (r Race) Run(t *testing.T) {
	t.Helper()
	sink := NewSink()
	var (
		holders                   = make([]atomic.Int32, r.Keys)
		overlaps, takeovers, late atomic.Int64
		retried                   atomic.Int64
		won                       atomic.Int64
		mu                        sync.Mutex
		lastToken                 = make([]int64, r.Keys)
		wg                        sync.WaitGroup
	)
	fail := func(err error) bool {
		if err != nil {
			t.Error(err)
		}
		return err != nil
	}
	for racer := range r.Racers {
		s := r.Store(t, racer)
		wg.Go(func() {
			var retries retrier
			for i := 0; won.Load() < int64(r.Wins); i++ {
				k := (racer + i) % r.Keys
				key := fmt.Sprintf("race:%d", k)
				start := time.Now()
				res, err := s.Acquire(context.Background(), backends.AcquireRequest{
					Key: key, Owner: fmt.Sprintf("racer-%d-%d", racer, i), LeaseTTL: r.LeaseTTL, Retention: time.Hour,
				})
				if retries.retry(err) {
					retried.Add(1)
					continue
				}
				if fail(err) {
					return
				}
				if res.Status != backends.StatusAcquired {
					continue
				}
				n := won.Add(1)
				overlapped := holders[k].Add(1) != 1
				if res.Lease.Takeover {
					takeovers.Add(1)
				}
				// A winner that paused past its lease before getting here
				// may find its successor's larger token already recorded.
				mu.Lock()
				if res.Lease.Token <= lastToken[k] && time.Since(start) < r.LeaseTTL {
					t.Errorf("key %d: token %d after %d", k, res.Lease.Token, lastToken[k])
				}
				lastToken[k] = max(lastToken[k], res.Lease.Token)
				mu.Unlock()
				applyErr := sink.Apply(res.Lease)
				holders[k].Add(-1)
				inTime := time.Since(start) < r.LeaseTTL
				if overlapped && inTime {
					overlaps.Add(1)
				}
				if applyErr != nil && inTime {
					t.Error(applyErr)
				}
				if n%8 == 0 {
					continue // walk away: the lease runs out and is taken over
				}
				err = s.Release(context.Background(), res.Lease)
				if errors.Is(err, backends.ErrLeaseLost) && time.Since(start) >= r.LeaseTTL {
					late.Add(1)
					continue
				}
				fail(err)
			}
		})
	}
	wg.Wait()
	_, refused, err := sink.Tally()
	if err != nil {
		t.Fatal(err)
	}
	if overlaps.Load() != 0 {
		t.Errorf("holders overlapped within a lease %d times", overlaps.Load())
	}
	if takeovers.Load() == 0 {
		t.Error("no lease was taken over")
	}
	t.Logf("%d acquisitions by %d racers on %d keys, %d of them takeovers; %d releases came after the lease, %d stale writes refused, %d failed acquisitions retried",
		won.Load(), r.Racers, r.Keys, takeovers.Load(), late.Load(), refused, retried.Load())
}

// maxErrorsInARow is how many failed Acquire calls in a row a retrier
// retries.
const maxErrorsInARow = 5

// retrier decides, for a caller racing others for the same keys, whether
// to retry a failed Acquire. A store may give up on a key that other
// callers keep taking and releasing under its writes (dynamostore does,
// after a bounded number of writes, sooner where round trips are slow, as
// on a loaded machine), with an error its caller retries, as the
// middleware retries every error not marked [backends.ErrRejected]. So
// does a retrier, but not the maxErrorsInARow-th error in a row: a store
// that keeps failing fails the test.
type retrier struct{ inARow int }

// retry reports whether to retry after an Acquire that returned err.
func (r *retrier) retry(err error) bool {
	if err == nil {
		r.inARow = 0
		return false
	}
	r.inARow++
	return !errors.Is(err, backends.ErrRejected) && r.inARow < maxErrorsInARow
}
