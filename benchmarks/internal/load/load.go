// Package load drives a store from many goroutines for the benchmark
// programs.
package load

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// keySeq numbers keys across every run of a process, so no key is used
// twice; runID keeps processes apart.
var (
	keySeq atomic.Int64
	runID  = strconv.FormatInt(time.Now().UnixNano(), 36)
)

// NextKey returns a key no earlier call returned.
func NextKey() string { return runID + "-" + strconv.FormatInt(keySeq.Add(1), 10) }

// Cycles runs op on fresh keys from n goroutines for d and returns
// operations per second. The first error stops its goroutine and is
// returned.
func Cycles(n int, d time.Duration, op func(ctx context.Context, key string) error) (float64, error) {
	var done atomic.Int64
	var firstErr atomic.Value
	stop := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			ctx := context.Background()
			for time.Now().Before(stop) {
				if err := op(ctx, NextKey()); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}

// Sequential returns the median time of op run n times one after another.
func Sequential(n int, op func(ctx context.Context, key string) error) (time.Duration, error) {
	lat := make([]time.Duration, n)
	for i := range lat {
		key := NextKey()
		start := time.Now()
		if err := op(context.Background(), key); err != nil {
			return 0, err
		}
		lat[i] = time.Since(start)
	}
	return MedianDuration(lat), nil
}

// Median returns the median of v.
func Median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// MedianDuration returns the median of v.
func MedianDuration(v []time.Duration) time.Duration {
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// Origin is the origin the middleware gives the lease of a delivery of
// a message to a handler, "message_uuid=<uuid> handler=<name>", for a
// message whose UUID is 36 bytes as Watermill's are: 70 bytes, whatever
// the key's length (the key's end stands in for the UUID).
func Origin(key string) string {
	uuid := fmt.Sprintf("%036s", key)
	return "message_uuid=" + uuid[len(uuid)-36:] + " handler=charge-order"
}

// StoreCycle is one cycle of a store on a fresh key: Acquire, then
// Complete with no output, as the middleware does for a message.
func StoreCycle(store backends.Store) func(ctx context.Context, key string) error {
	return func(ctx context.Context, key string) error {
		res, err := store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: key, LeaseTTL: 30 * time.Second, Retention: time.Hour,
			Origin: Origin(key)})
		if err != nil {
			return err
		}
		if res.Status != backends.StatusAcquired {
			return fmt.Errorf("key %s: %v", key, res.Status)
		}
		return store.Complete(ctx, res.Lease, nil)
	}
}

// Rounds runs the steps rounds times, in an order that rotates each
// round, so that no step always follows another.
func Rounds(rounds int, steps ...func() error) error {
	for round := range rounds {
		for i := range steps {
			if err := steps[(i+round)%len(steps)](); err != nil {
				return err
			}
		}
	}
	return nil
}

// PerCall times calls one kind after another, each on n fresh keys, rounds
// times: kinds returns a round's calls, each for the key at index i of
// keys, and used reports the server's CPU time so far. It returns the
// median server CPU per call of each kind, in kinds' order; names name
// them in errors.
func PerCall(rounds, n int, names []string, used func() (time.Duration, error), kinds func(keys []string) []func(i int) error) ([]time.Duration, error) {
	per := make([][]time.Duration, len(names))
	for round := range rounds {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = NextKey()
		}
		for k, kind := range kinds(keys) {
			before, err := used()
			if err != nil {
				return nil, err
			}
			for i := range keys {
				if err := kind(i); err != nil {
					return nil, fmt.Errorf("round %d, %s: %w", round+1, names[k], err)
				}
			}
			after, err := used()
			if err != nil {
				return nil, err
			}
			per[k] = append(per[k], (after-before)/time.Duration(n))
		}
	}
	medians := make([]time.Duration, len(per))
	for k := range per {
		medians[k] = MedianDuration(per[k])
	}
	return medians, nil
}

// StoreCalls returns the store's calls a per-call table times, each for
// the key at index i of keys: a fresh key's Acquire, its Complete, and an
// Acquire of the completed key by another owner (a duplicate).
func StoreCalls(ctx context.Context, store backends.Store, keys []string) []func(i int) error {
	request := func(key, owner string) backends.AcquireRequest {
		return backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: 30 * time.Second, Retention: time.Hour, Origin: Origin(key)}
	}
	leases := make([]backends.Lease, len(keys))
	return []func(i int) error{
		func(i int) error {
			res, err := store.Acquire(ctx, request(keys[i], "holder"))
			if err == nil && res.Status != backends.StatusAcquired {
				err = fmt.Errorf("acquire of a fresh key: %v", res.Status)
			}
			leases[i] = res.Lease
			return err
		},
		func(i int) error { return store.Complete(ctx, leases[i], nil) },
		func(i int) error {
			res, err := store.Acquire(ctx, request(keys[i], "duplicate"))
			if err == nil && res.Status != backends.StatusCompleted {
				err = fmt.Errorf("acquire of a completed key: %v", res.Status)
			}
			return err
		},
	}
}
