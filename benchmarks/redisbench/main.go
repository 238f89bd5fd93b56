// Command redisbench measures the Redis store against the server's own limit
// and against the lock a Go developer would otherwise reach for, all in one
// run, on one server, at one client concurrency:
//
//	(a) redis-benchmark running an equivalent single-key SET NX PX script
//	(b) the store's Acquire+Complete cycles per second
//	(c) github.com/bsm/redislock Obtain+Release cycles per second
//	(d) the middleware end to end on a GoChannel router: the latency it adds
//	    per message, in Redis round trips (a PING measured in the same run),
//	    and against two back-to-back PINGs and the store's own two calls
//	(e) 50 concurrent deliveries in one process on one client: the store's
//	    Acquire+Complete cycles per second with calls coalesced (the
//	    default), (f) redislock Obtain+Release and (g) the store with
//	    CoalesceOff, at the same concurrency
//	(h) one caller: Acquire+Complete back to back with coalescing on and
//	    off, the two alternating cycle by cycle
//	(i) the server's time per call of each store call, alone, one caller
//	    (INFO commandstats before and after each: the scripts' EVALSHA, or
//	    the plain commands of a call that runs none), and (j) the same from
//	    as many callers at once as (e) has deliveries
//
// For (e), (f) and (g) it also reads how busy the server's main thread
// was (INFO cpu, before and after each run): a store whose calls are
// already batched cannot go faster than that thread runs its scripts. And
// it divides by the cycles of the run the CPU time the whole server used
// (INFO cpu used_cpu_sys + used_cpu_user) and the CPU time this process,
// the client, used (getrusage): the cost of a cycle on each side.
//
// It prints a table with the ratios, and the memory one completed record
// takes.
//
//	go run ./redisbench -addr 127.0.0.1:6379 -clients 50 -deliveries 50 -duration 5s
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/benchmarks/internal/load"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "Redis address")
	clients := flag.Int("clients", 50, "concurrent clients for (a), (b) and (c)")
	duration := flag.Duration("duration", 5*time.Second, "how long to run (b) and (c)")
	requests := flag.Int("requests", 200000, "requests for redis-benchmark (a)")
	messages := flag.Int("messages", 3000, "messages for (d)")
	rounds := flag.Int("rounds", 3, "rounds of (a), (b) and (c), and of (e), (f) and (g), interleaved; medians are reported")
	deliveries := flag.Int("deliveries", 50, "concurrent deliveries for (e), (f) and (g)")
	flag.Parse()
	if err := run(*addr, *clients, *deliveries, *duration, *requests, *messages, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "redisbench:", err)
		os.Exit(1)
	}
}

func run(addr string, clients, deliveries int, duration time.Duration, requests, messages, rounds int) error {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: clients, ContextTimeoutEnabled: true})
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", addr, err)
	}
	prefix := fmt.Sprintf("redisbench:%d:", time.Now().UnixNano())
	defer cleanup(client, prefix)
	store, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	if err != nil {
		return err
	}

	rtt, err := pingRTT(ctx, client, 5000, 1)
	if err != nil {
		return err
	}
	rtt2, err := pingRTT(ctx, client, 5000, 2)
	if err != nil {
		return err
	}
	acquireComplete := func(ctx context.Context, key string) error {
		res, err := store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: key, LeaseTTL: 30 * time.Second, Retention: time.Minute,
			Origin: load.Origin(key)})
		if err != nil {
			return err
		}
		if res.Status != backends.StatusAcquired {
			return fmt.Errorf("key %s: %v", key, res.Status)
		}
		return store.Complete(ctx, res.Lease, nil)
	}
	locker := redislock.New(client)
	obtainRelease := func(ctx context.Context, key string) error {
		l, err := locker.Obtain(ctx, prefix+"lock:"+key, 30*time.Second, nil)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	// Interleave the three so that drift in the machine's load hits each
	// alike, and report medians.
	var limits, ourRuns, lockRuns []float64
	for round := range rounds {
		steps := []func() error{
			func() error {
				v, err := redisBenchmark(addr, clients, requests, prefix)
				limits = append(limits, v)
				return err
			},
			func() error {
				v, err := load.Cycles(clients, duration, acquireComplete)
				ourRuns = append(ourRuns, v)
				return err
			},
			func() error {
				v, err := load.Cycles(clients, duration, obtainRelease)
				lockRuns = append(lockRuns, v)
				return err
			},
		}
		for i := range steps {
			if err := steps[(i+round)%len(steps)](); err != nil {
				return err
			}
		}
	}
	limit, ours, lock := load.Median(limits), load.Median(ourRuns), load.Median(lockRuns)
	pair, err := load.Sequential(messages, acquireComplete)
	if err != nil {
		return err
	}
	bare, err := routerLatency(nil, messages)
	if err != nil {
		return err
	}
	idem, err := idempotency.New(idempotency.Config{Store: store})
	if err != nil {
		return err
	}
	withStore, err := routerLatency(idem.Middleware, messages)
	if err != nil {
		return err
	}
	mem, err := recordMemory(ctx, client, store, prefix)
	if err != nil {
		return err
	}
	co, err := coalescing(addr, prefix, deliveries, duration, messages, rounds)
	if err != nil {
		return err
	}
	costs, err := callCosts(ctx, client, store, 2000, 1)
	if err != nil {
		return err
	}
	loaded, err := callCosts(ctx, client, store, 20000, deliveries)
	if err != nil {
		return err
	}

	added := withStore - bare
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "Redis store benchmark: %s, %d clients, %v per throughput run, median of %d interleaved rounds\n\n", addr, clients, duration, rounds)
	fmt.Fprintln(w, "measure\tvalue\tratio\tgoal\t")
	fmt.Fprintf(w, "PING round trip (one client)\t%s\t\t\t\n", us(rtt))
	fmt.Fprintf(w, "two PINGs back to back\t%s\t%.2f round trips\t\t\n", us(rtt2), float64(rtt2)/float64(rtt))
	fmt.Fprintf(w, "(a) redis-benchmark EVAL SET NX PX\t%s ops/s\t\t\t\n", count(limit))
	fmt.Fprintf(w, "(b) Acquire+Complete\t%s cycles/s\t%.3f × (a)/2\t≥ 0.80\t\n", count(ours), ours/(limit/2))
	fmt.Fprintf(w, "(c) redislock Obtain+Release\t%s cycles/s\t%.3f = (b)/(c)\t≥ 1.00\t\n", count(lock), ours/lock)
	fmt.Fprintf(w, "(d) router, no middleware\t%s per message\t\t\t\n", us(bare))
	fmt.Fprintf(w, "(d) router, Redis store\t%s per message\t\t\t\n", us(withStore))
	fmt.Fprintf(w, "(d) added by the middleware\t%s\t%.2f round trips\t≤ 2.5\t\n", us(added), float64(added)/float64(rtt))
	fmt.Fprintf(w, "(d) the same against back-to-back PINGs\t\t%.2f × two PINGs\t\t\n", float64(added)/float64(rtt2))
	fmt.Fprintf(w, "Acquire+Complete back to back, one client\t%s\t%.2f round trips\t\t\n", us(pair), float64(pair)/float64(rtt))
	fmt.Fprintf(w, "(d) against the store's own two calls\t\t%.2f × Acquire+Complete\t\t\n", float64(added)/float64(pair))
	fmt.Fprintf(w, "memory per completed record\t%d bytes\t\t\t\n", mem)
	fmt.Fprintf(w, "(e) %d deliveries: Acquire+Complete, coalesced\t%s cycles/s\t%.2f = (e)/(f)\t≥ 2.20\t\n", deliveries, count(co.on), co.on/co.lock)
	fmt.Fprintf(w, "(f) %d deliveries: redislock Obtain+Release\t%s cycles/s\t\t\t\n", deliveries, count(co.lock))
	fmt.Fprintf(w, "(g) %d deliveries: Acquire+Complete, CoalesceOff\t%s cycles/s\t%.2f = (e)/(g)\t\t\n", deliveries, count(co.off), co.on/co.off)
	fmt.Fprintf(w, "(g) against redislock\t\t%.2f = (g)/(f)\t\t\n", co.off/co.lock)
	fmt.Fprintf(w, "Redis main thread busy during (e), (f), (g)\t%.0f%%, %.0f%%, %.0f%%\t\t\t\n", 100*co.busyOn, 100*co.busyLock, 100*co.busyOff)
	fmt.Fprintf(w, "calls per server read during (e), (f), (g)\t%.1f, %.1f, %.1f\t\t\t\n", co.perReadOn, co.perReadLock, co.perReadOff)
	fmt.Fprintf(w, "(e) server CPU per cycle, coalesced\t%.1f µs\t%.2f × (f)\t≤ 12 µs\t\n", co.srvOn, co.srvOn/co.srvLock)
	fmt.Fprintf(w, "(f) server CPU per cycle, redislock\t%.1f µs\t\t\t\n", co.srvLock)
	fmt.Fprintf(w, "(g) server CPU per cycle, CoalesceOff\t%.1f µs\t\t\t\n", co.srvOff)
	fmt.Fprintf(w, "(e) client CPU per cycle, coalesced\t%.1f µs\t%.2f × (f)\t\t\n", co.cliOn, co.cliOn/co.cliLock)
	fmt.Fprintf(w, "(f) client CPU per cycle, redislock\t%.1f µs\t\t\t\n", co.cliLock)
	fmt.Fprintf(w, "(g) client CPU per cycle, CoalesceOff\t%.1f µs\t\t\t\n", co.cliOff)
	fmt.Fprintf(w, "server + client CPU per cycle, (f)/(e)\t%.1f / %.1f µs\t%.2f = (f)/(e)\t≥ 2.50\t\n",
		co.srvLock+co.cliLock, co.srvOn+co.cliOn, (co.srvLock+co.cliLock)/(co.srvOn+co.cliOn))
	fmt.Fprintf(w, "(h) one caller: Acquire+Complete, coalescing on\t%s\t%.3f × off\t≤ 1.05\t\n", us(co.loneOn), float64(co.loneOn)/float64(co.loneOff))
	fmt.Fprintf(w, "(h) one caller: Acquire+Complete, CoalesceOff\t%s\t\t\t\n", us(co.loneOff))
	fmt.Fprintln(w, "\t\t\t\t")
	fmt.Fprintln(w, "(i) server time per store call (INFO commandstats)\tcommand\tcalls\tµs per call\t")
	for _, c := range costs {
		fmt.Fprintf(w, "%s\t%s\t%d\t%.2f\t\n", c.call, c.cmd, c.calls, c.usecPerCall)
	}
	fmt.Fprintln(w, "\t\t\t\t")
	fmt.Fprintf(w, "(j) the same, %d callers at once (coalesced)\tcommand\tcalls\tµs per call\tgoal\t\n", deliveries)
	for _, c := range loaded {
		goal := ""
		if c.cmd == "evalsha" && (c.call == "Complete" || c.call == "Renew" || c.call == "Release") {
			goal = "≤ 8"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%.2f\t%s\t\n", c.call, c.cmd, c.calls, c.usecPerCall, goal)
	}
	return w.Flush()
}

// cost is what the server spent on one command during one kind of store
// call.
type cost struct {
	call, cmd   string
	calls       int64
	usecPerCall float64
}

// callCosts runs each kind of store call n times on fresh keys, from par
// callers at once (1: one after another), and reads from INFO
// commandstats what the server spent on each: the scripts (EVALSHA, EVAL;
// their time includes the commands they call), or the plain commands of a
// call that runs no script. One caller leaves the server idle between
// calls, which makes each call run on cold caches; many keep it busy, as
// a service under load does.
func callCosts(ctx context.Context, c *redis.Client, store *redisstore.Store, n, par int) ([]cost, error) {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = load.NextKey()
	}
	leases := make([]backends.Lease, n)
	acquire := func(owner string, want backends.Status) func(int) error {
		return func(i int) error {
			res, err := store.Acquire(ctx, backends.AcquireRequest{Key: keys[i], Owner: owner + keys[i], LeaseTTL: 30 * time.Second, Retention: time.Hour,
				Origin: load.Origin(keys[i])})
			if err != nil {
				return err
			}
			if res.Status != want {
				return fmt.Errorf("key %s: %v, want %v", keys[i], res.Status, want)
			}
			leases[i] = res.Lease
			return nil
		}
	}
	steps := []struct {
		name string
		op   func(int) error
	}{
		{"Acquire, new key", acquire("a", backends.StatusAcquired)},
		{"Renew", func(i int) error { return store.Renew(ctx, leases[i], 30*time.Second) }},
		{"Release", func(i int) error { return store.Release(ctx, leases[i]) }},
		{"Acquire, released key", acquire("b", backends.StatusAcquired)},
		{"Complete", func(i int) error { return store.Complete(ctx, leases[i], nil) }},
		{"Acquire, completed key", acquire("c", backends.StatusCompleted)},
	}
	var out []cost
	for _, st := range steps {
		before, err := commandStats(ctx, c)
		if err != nil {
			return nil, err
		}
		var next atomic.Int64
		errs := make(chan error, par)
		for range par {
			go func() {
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					if err := st.op(i); err != nil {
						errs <- fmt.Errorf("%s: %w", st.name, err)
						return
					}
				}
				errs <- nil
			}()
		}
		for range par {
			if e := <-errs; e != nil && err == nil {
				err = e
			}
		}
		if err != nil {
			return nil, err
		}
		after, err := commandStats(ctx, c)
		if err != nil {
			return nil, err
		}
		var rows []cost
		scripts := false
		for cmd, a := range after {
			b := before[cmd]
			if a[0] == b[0] {
				continue
			}
			calls, usec := a[0]-b[0], a[1]-b[1]
			rows = append(rows, cost{call: st.name, cmd: cmd, calls: calls, usecPerCall: float64(usec) / float64(calls)})
			scripts = scripts || cmd == "evalsha" || cmd == "eval"
		}
		if scripts {
			rows = slices.DeleteFunc(rows, func(r cost) bool { return r.cmd != "evalsha" && r.cmd != "eval" })
		}
		rows = slices.DeleteFunc(rows, func(r cost) bool { return r.cmd == "info" })
		slices.SortFunc(rows, func(a, b cost) int { return strings.Compare(a.cmd, b.cmd) })
		out = append(out, rows...)
	}
	return out, nil
}

// commandStats returns INFO commandstats: calls and usec by command.
func commandStats(ctx context.Context, c *redis.Client) (map[string][2]int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string][2]int64{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var v [2]int64
		for field := range strings.SplitSeq(rest, ",") {
			k, val, _ := strings.Cut(field, "=")
			switch k {
			case "calls":
				v[0], _ = strconv.ParseInt(val, 10, 64)
			case "usec":
				v[1], _ = strconv.ParseInt(val, 10, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = v
	}
	return out, nil
}

// clientCPU is the CPU time this process has used, user and system.
func clientCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// coalesced holds the figures of (e) to (h), and the share of its time
// the server's main thread was busy during (e), (f) and (g).
type coalesced struct {
	on, off, lock             float64
	busyOn, busyOff, busyLock float64
	// µs of CPU per cycle: the whole server's, and this process's
	srvOn, srvOff, srvLock float64
	cliOn, cliOff, cliLock float64
	// calls (two per cycle) per read of the server from a connection
	perReadOn, perReadOff, perReadLock float64
	loneOn, loneOff                    time.Duration
}

// coalescing measures (e) to (h) on a client of its own whose pool has a
// connection for each delivery, so that neither uncoalesced loop waits
// for one.
func coalescing(addr, prefix string, deliveries int, duration time.Duration, messages, rounds int) (coalesced, error) {
	var r coalesced
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: deliveries, ContextTimeoutEnabled: true})
	defer client.Close()
	on, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	if err != nil {
		return r, err
	}
	off, err := redisstore.New(client, redisstore.Options{Prefix: prefix, Coalescing: redisstore.CoalesceOff})
	if err != nil {
		return r, err
	}
	locker := redislock.New(client)
	obtainRelease := func(ctx context.Context, key string) error {
		l, err := locker.Obtain(ctx, prefix+"lock:"+key, 30*time.Second, nil)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	type runs struct{ rate, busy, srv, cli, perRead []float64 }
	var onRuns, offRuns, lockRuns runs
	measure := func(m *runs, op func(context.Context, string) error) func() error {
		return func() error {
			var cycles atomic.Int64
			counted := func(ctx context.Context, key string) error {
				err := op(ctx, key)
				if err == nil {
					cycles.Add(1)
				}
				return err
			}
			cpu0, err := serverCPU(client)
			if err != nil {
				return err
			}
			srv0, err := serverProcessCPU(client)
			if err != nil {
				return err
			}
			cli0, err := clientCPU()
			if err != nil {
				return err
			}
			reads0, err := serverReads(client)
			if err != nil {
				return err
			}
			start := time.Now()
			v, err := load.Cycles(deliveries, duration, counted)
			if err != nil {
				return err
			}
			elapsed := time.Since(start)
			cli1, err := clientCPU()
			if err != nil {
				return err
			}
			cpu1, err := serverCPU(client)
			if err != nil {
				return err
			}
			srv1, err := serverProcessCPU(client)
			if err != nil {
				return err
			}
			reads1, err := serverReads(client)
			if err != nil {
				return err
			}
			n := float64(cycles.Load())
			m.perRead = append(m.perRead, 2*n/(reads1-reads0))
			m.rate = append(m.rate, v)
			m.busy = append(m.busy, (cpu1-cpu0).Seconds()/elapsed.Seconds())
			m.srv = append(m.srv, float64((srv1-srv0)/time.Nanosecond)/1e3/n)
			m.cli = append(m.cli, float64((cli1-cli0)/time.Nanosecond)/1e3/n)
			return nil
		}
	}
	if err := load.Rounds(rounds,
		measure(&onRuns, load.StoreCycle(on)),
		measure(&lockRuns, obtainRelease),
		measure(&offRuns, load.StoreCycle(off)),
	); err != nil {
		return r, err
	}
	r.on, r.off, r.lock = load.Median(onRuns.rate), load.Median(offRuns.rate), load.Median(lockRuns.rate)
	r.busyOn, r.busyOff, r.busyLock = load.Median(onRuns.busy), load.Median(offRuns.busy), load.Median(lockRuns.busy)
	r.srvOn, r.srvOff, r.srvLock = load.Median(onRuns.srv), load.Median(offRuns.srv), load.Median(lockRuns.srv)
	r.cliOn, r.cliOff, r.cliLock = load.Median(onRuns.cli), load.Median(offRuns.cli), load.Median(lockRuns.cli)
	r.perReadOn, r.perReadOff, r.perReadLock = load.Median(onRuns.perRead), load.Median(offRuns.perRead), load.Median(lockRuns.perRead)
	r.loneOn, r.loneOff, err = alternating(messages, load.StoreCycle(on), load.StoreCycle(off))
	return r, err
}

// alternating runs a and b n times each on fresh keys, one after the
// other, alternating which goes first, and returns the median time of
// each.
func alternating(n int, a, b func(context.Context, string) error) (time.Duration, time.Duration, error) {
	la, lb := make([]time.Duration, n), make([]time.Duration, n)
	timed := func(op func(context.Context, string) error, d *time.Duration) error {
		key := load.NextKey()
		start := time.Now()
		err := op(context.Background(), key)
		*d = time.Since(start)
		return err
	}
	for i := range n {
		var err error
		if i%2 == 0 {
			err = errors.Join(timed(a, &la[i]), timed(b, &lb[i]))
		} else {
			err = errors.Join(timed(b, &lb[i]), timed(a, &la[i]))
		}
		if err != nil {
			return 0, 0, err
		}
	}
	return load.MedianDuration(la), load.MedianDuration(lb), nil
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond)) }

func count(f float64) string { return strconv.FormatFloat(math.Round(f), 'f', 0, 64) }

// pingRTT returns the median time of per PINGs sent one after another,
// over n samples.
func pingRTT(ctx context.Context, c *redis.Client, n, per int) (time.Duration, error) {
	lat := make([]time.Duration, n)
	for i := range lat {
		start := time.Now()
		for range per {
			if err := c.Ping(ctx).Err(); err != nil {
				return 0, err
			}
		}
		lat[i] = time.Since(start)
	}
	return load.MedianDuration(lat), nil
}

// redisBenchmark runs redis-benchmark with a script equivalent to the
// store's acquire at its simplest: one key, SET NX PX.
func redisBenchmark(addr string, clients, requests int, prefix string) (float64, error) {
	host, port, _ := strings.Cut(addr, ":")
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark is not installed (apt-get install -y redis-tools): %w", err)
	}
	out, err := exec.Command(bin, "-h", host, "-p", port, "-c", strconv.Itoa(clients), "-n", strconv.Itoa(requests),
		"-r", "100000000", "--csv",
		"EVAL", "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 30000)", "1", prefix+"rb:__rand_int__", "v").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %w\n%s", err, out)
	}
	r := csv.NewReader(bufio.NewReader(bytes.NewReader(out)))
	recs, err := r.ReadAll()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark output: %w\n%s", err, out)
	}
	for _, rec := range recs {
		if len(rec) >= 2 && rec[0] != "test" {
			return strconv.ParseFloat(rec[1], 64)
		}
	}
	return 0, fmt.Errorf("redis-benchmark printed no result:\n%s", out)
}

// routerLatency publishes messages one at a time through a GoChannel
// router, each waiting for its ack, and returns the median latency.
func routerLatency(mw message.HandlerMiddleware, n int) (time.Duration, error) {
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	defer ps.Close()
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return 0, err
	}
	h := router.AddConsumerHandler("bench", "in", ps, func(*message.Message) error { return nil })
	if mw != nil {
		h.AddMiddleware(mw)
	}
	go func() { _ = router.Run(context.Background()) }()
	defer router.Close()
	<-router.Running()

	lat := make([]time.Duration, n)
	for i := range lat {
		msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
		start := time.Now()
		if err := ps.Publish("in", msg); err != nil {
			return 0, err
		}
		lat[i] = time.Since(start)
	}
	return load.MedianDuration(lat), nil
}

// recordMemory returns what Redis reports for one completed record with a
// UUID-sized key and no output.
func recordMemory(ctx context.Context, c *redis.Client, store *redisstore.Store, prefix string) (int64, error) {
	key := "orders:" + watermill.NewUUID()
	res, err := store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: watermill.NewULID(), LeaseTTL: time.Minute, Retention: time.Hour,
		Origin: load.Origin(key)})
	if err != nil {
		return 0, err
	}
	if err := store.Complete(ctx, res.Lease, nil); err != nil {
		return 0, err
	}
	n, err := c.MemoryUsage(ctx, prefix+key).Result()
	if errors.Is(err, redis.Nil) {
		return 0, errors.New("record not found")
	}
	return n, err
}

// cleanup removes the run's keys.
func cleanup(c *redis.Client, prefix string) {
	ctx := context.Background()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			c.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		c.Unlink(ctx, batch...)
	}
}

// serverProcessCPU is the CPU time the whole server process has used,
// user and system (INFO cpu).
func serverProcessCPU(c *redis.Client) (time.Duration, error) {
	fields, err := cpuInfo(c)
	if err != nil {
		return 0, err
	}
	return time.Duration((fields["used_cpu_user"] + fields["used_cpu_sys"]) * float64(time.Second)), nil
}

// serverCPU is the CPU time the server's main thread has used (INFO cpu,
// Redis 6.2 and later), or the whole process's on an older server.
func serverCPU(c *redis.Client) (time.Duration, error) {
	fields, err := cpuInfo(c)
	if err != nil {
		return 0, err
	}
	secs, ok := fields["used_cpu_user_main_thread"]
	if ok {
		secs += fields["used_cpu_sys_main_thread"]
	} else {
		secs = fields["used_cpu_user"] + fields["used_cpu_sys"]
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// cpuInfo returns the numbers of INFO cpu by name.
func cpuInfo(c *redis.Client) (map[string]float64, error) { return infoNumbers(c, "cpu") }

// serverReads is how many times the server has read from its clients'
// connections (INFO stats, Redis 6.0 and later).
func serverReads(c *redis.Client) (float64, error) {
	fields, err := infoNumbers(c, "stats")
	return fields["total_reads_processed"], err
}

// infoNumbers returns the numbers of an INFO section by name.
func infoNumbers(c *redis.Client, section string) (map[string]float64, error) {
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		return nil, err
	}
	fields := map[string]float64{}
	for line := range strings.Lines(info) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(value, 64); err == nil {
			fields[name] = f
		}
	}
	return fields, nil
}
