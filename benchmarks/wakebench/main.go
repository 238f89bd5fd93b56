// Command wakebench measures how soon a waiting duplicate learns of its
// holder's completion, on Redis and on Postgres, polled (the store's
// backends.Watcher hidden, as before stores could wake waiters) and
// watched, in one run:
//
//   - the time from the holder's completion (its Complete returned: the
//     completion is committed) to the duplicate's ack (the middleware
//     returning nil), p50 and p99, and from the start of the holder's
//     Complete, which adds the holder's own write (on Postgres, a commit's
//     WAL flush);
//   - the store calls the duplicate made while it waited, counted apart:
//     its Acquires, and its Watch calls (on Postgres each one UPDATE round
//     trip that marks the row; on Redis an SSUBSCRIBE on the process's
//     shared subscription connection, none if the key is subscribed
//     already).
//
// For each hold time, a holder takes a key, a duplicate of it goes through
// the middleware with its default waiting settings, and the holder
// completes the key the hold time after the duplicate first found it in
// progress. Several
// keys run at once.
//
//	go run ./wakebench -redis 127.0.0.1:6379 -pg postgres://postgres@127.0.0.1:5432/test
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
	"github.com/watermill-idempotency/idempotency/benchmarks/internal/load"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

func main() {
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address")
	pgURL := flag.String("pg", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "Postgres URL")
	holdList := flag.String("hold", "10ms,100ms,1s", "hold times, comma-separated")
	samples := flag.Int("samples", 60, "waits per store, mode and hold time")
	parallel := flag.Int("parallel", 6, "waits at once")
	flag.Parse()
	var holds []time.Duration
	for _, h := range strings.Split(*holdList, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(h))
		if err != nil {
			fmt.Fprintln(os.Stderr, "wakebench: -hold:", err)
			os.Exit(2)
		}
		holds = append(holds, d)
	}
	if err := run(*redisAddr, *pgURL, holds, *samples, *parallel); err != nil {
		fmt.Fprintln(os.Stderr, "wakebench:", err)
		os.Exit(1)
	}
}

// pollOnly hides a store's backends.Watcher: the middleware polls it.
type pollOnly struct{ backends.Store }

// counted counts Acquire and Watch calls, closes waiting when the first
// Acquire has returned, and keeps the store's Watcher.
type counted struct {
	backends.Store
	acquires, watches *atomic.Int64
	waiting           func()
}

func (c counted) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	res, err := c.Store.Acquire(ctx, req)
	c.acquires.Add(1)
	c.waiting()
	return res, err
}

func (c counted) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	c.watches.Add(1)
	return storekit.WatchOf(ctx, c.Store, key)
}

// sample is one wait.
type sample struct {
	latency time.Duration // from the holder's Complete returning to the ack
	total   time.Duration // from the start of the holder's Complete to the ack
	calls   int64         // the duplicate's Acquires
	watches int64         // the duplicate's Watch calls
}

type row struct {
	store, mode string
	hold        time.Duration
	p50, p99    time.Duration // from the completion
	total50     time.Duration // from the start of Complete
	calls       float64       // Acquires, mean
	maxCalls    int64
	watches     float64 // Watch calls, mean
	maxWatches  int64
}

func run(redisAddr, pgURL string, holds []time.Duration, samples, parallel int) error {
	ctx := context.Background()
	rc := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer rc.Close()
	if err := rc.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", redisAddr, err)
	}
	prefix := fmt.Sprintf("wakebench:%d:", time.Now().UnixNano())
	rs, err := redisstore.New(rc, redisstore.Options{Prefix: prefix})
	if err != nil {
		return err
	}
	defer rs.Close()
	defer func() {
		if keys, err := rc.Keys(context.Background(), prefix+"*").Result(); err == nil && len(keys) > 0 {
			rc.Del(context.Background(), keys...)
		}
	}()

	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := fmt.Sprintf("wakebench_%d", time.Now().UnixNano()%1e9)
	defer pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) //nolint:errcheck
	ps, err := pgstore.New(pool, pgstore.Options{Schema: schema})
	if err != nil {
		return err
	}
	defer ps.Close()
	if err := ps.Migrate(ctx); err != nil {
		return err
	}

	var rows []row
	for _, st := range []struct {
		name  string
		store backends.Store
	}{{"Redis", rs}, {"Postgres", ps}} {
		if _, ok := st.store.(backends.Watcher); !ok {
			return fmt.Errorf("%s: the store cannot watch", st.name)
		}
		for _, hold := range holds {
			// Polled and watched alternate by batch, so that drift in the
			// machine's load hits both alike.
			var polled, watched []sample
			for len(watched) < samples {
				n := min(parallel, samples-len(watched))
				for _, watch := range []bool{false, true} {
					got, err := waits(st.store, watch, hold, n)
					if err != nil {
						return fmt.Errorf("%s, hold %v: %w", st.name, hold, err)
					}
					if watch {
						watched = append(watched, got...)
					} else {
						polled = append(polled, got...)
					}
				}
			}
			rows = append(rows, summarize(st.name, "polled", hold, polled), summarize(st.name, "watched", hold, watched))
		}
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "Wake-up benchmark: %d waits per row, %d at once; from the holder's completion (its Complete returned) to the duplicate's ack, and from the start of its Complete; the middleware's default waiting settings\n", samples, parallel)
	fmt.Fprintf(w, "Store calls per wait, mean and max: the duplicate's Acquires, and its Watch calls (Postgres: one UPDATE round trip each; Redis: an SSUBSCRIBE on the shared subscription connection)\n\n")
	fmt.Fprintln(w, "store\tmode\thold\tp50\tp99\tp50 from Complete's start\tAcquires per wait\tWatch calls per wait\tgoal (watched)\t")
	for _, r := range rows {
		goal := ""
		if r.mode == "watched" {
			goal = "p50 ≤ 2 ms, ≤ 3 store calls"
		}
		fmt.Fprintf(w, "%s\t%s\t%v\t%s\t%s\t%s\t%.2f, %d\t%.2f, %d\t%s\t\n", r.store, r.mode, r.hold, ms(r.p50), ms(r.p99), ms(r.total50),
			r.calls, r.maxCalls, r.watches, r.maxWatches, goal)
	}
	return w.Flush()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

func summarize(store, mode string, hold time.Duration, s []sample) row {
	lat := make([]time.Duration, len(s))
	total := make([]time.Duration, len(s))
	var sum, maxCalls, sumWatches, maxWatches int64
	for i, x := range s {
		lat[i], total[i] = x.latency, x.total
		sum += x.calls
		maxCalls = max(maxCalls, x.calls)
		sumWatches += x.watches
		maxWatches = max(maxWatches, x.watches)
	}
	slices.Sort(lat)
	slices.Sort(total)
	return row{
		store: store, mode: mode, hold: hold,
		p50: lat[len(lat)/2], p99: lat[min(len(lat)-1, len(lat)*99/100)], total50: total[len(total)/2],
		calls: float64(sum) / float64(len(s)), maxCalls: maxCalls,
		watches: float64(sumWatches) / float64(len(s)), maxWatches: maxWatches,
	}
}

// waits runs n waits at once, each on a key of its own.
func waits(store backends.Store, watch bool, hold time.Duration, n int) ([]sample, error) {
	out := make([]sample, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i], errs[i] = wait(store, watch, hold) })
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// wait runs one: a holder takes the key, a duplicate of it waits, and the
// holder completes the key hold after the duplicate first found it in
// progress.
func wait(store backends.Store, watch bool, hold time.Duration) (sample, error) {
	ctx := context.Background()
	var acquires, watches atomic.Int64
	waiting := make(chan struct{})
	var dup backends.Store = counted{Store: store, acquires: &acquires, watches: &watches, waiting: sync.OnceFunc(func() { close(waiting) })}
	if !watch {
		dup = pollOnly{dup}
	}
	var counters idempotency.Counters
	idem, err := idempotency.New(idempotency.Config{Store: dup, Namespace: "wake", Observer: &counters})
	if err != nil {
		return sample{}, err
	}
	id := load.NextKey()
	held, err := store.Acquire(ctx, backends.AcquireRequest{Key: "wake:" + id, Owner: "holder", LeaseTTL: time.Minute, Retention: time.Hour})
	if err != nil {
		return sample{}, err
	}
	if held.Status != backends.StatusAcquired {
		return sample{}, fmt.Errorf("holder: key %s %v", id, held.Status)
	}
	acked := make(chan time.Time, 1)
	failed := make(chan error, 1)
	go func() {
		_, err := idem.Middleware(func(*message.Message) ([]*message.Message, error) {
			return nil, errors.New("the duplicate ran the handler")
		})(message.NewMessage(id, nil))
		if err != nil {
			failed <- err
			return
		}
		acked <- time.Now()
	}()
	select {
	case <-waiting: // the duplicate found the key in progress
	case err := <-failed:
		return sample{}, fmt.Errorf("key %s: %w", id, err)
	}
	time.Sleep(hold)
	completing := time.Now()
	if err := store.Complete(ctx, held.Lease, nil); err != nil {
		return sample{}, err
	}
	completed := time.Now()
	select {
	case at := <-acked:
		if counters.Count(idempotency.OutcomeDuplicate) != 1 {
			return sample{}, fmt.Errorf("key %s: the ack was not a duplicate's", id)
		}
		// An ack before Complete returned (the wake can overtake the
		// holder's reply) counts as no wait.
		return sample{latency: max(0, at.Sub(completed)), total: at.Sub(completing), calls: acquires.Load(), watches: watches.Load()}, nil
	case err := <-failed:
		return sample{}, fmt.Errorf("key %s: %w", id, err)
	}
}
