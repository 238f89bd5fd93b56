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
//	(e) 64 concurrent deliveries in one process on one client: the store's
//	    Acquire+Complete cycles per second with calls coalesced (the
//	    default), (f) redislock Obtain+Release and (g) the store with
//	    CoalesceOff, at the same concurrency
//	(h) one caller: Acquire+Complete back to back with coalescing on and
//	    off, the two alternating cycle by cycle
//
// For (e), (f) and (g) it also reads how busy the server's main thread
// was (INFO cpu, before and after each run): a store whose calls are
// already batched cannot go faster than that thread runs its scripts.
//
// It prints a table with the ratios, and the memory one completed record
// takes.
//
//	go run ./redisbench -addr 127.0.0.1:6379 -clients 50 -deliveries 64 -duration 5s
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
	"strconv"
	"strings"
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
	deliveries := flag.Int("deliveries", 64, "concurrent deliveries for (e), (f) and (g)")
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
		res, err := store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: key, LeaseTTL: 30 * time.Second, Retention: time.Minute})
		if err != nil {
			return err
		}
		if res.Status != backends.Acquired {
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
	fmt.Fprintf(w, "(e) %d deliveries: Acquire+Complete, coalesced\t%s cycles/s\t%.2f = (e)/(f)\t≥ 2.00\t\n", deliveries, count(co.on), co.on/co.lock)
	fmt.Fprintf(w, "(f) %d deliveries: redislock Obtain+Release\t%s cycles/s\t\t\t\n", deliveries, count(co.lock))
	fmt.Fprintf(w, "(g) %d deliveries: Acquire+Complete, CoalesceOff\t%s cycles/s\t%.2f = (e)/(g)\t\t\n", deliveries, count(co.off), co.on/co.off)
	fmt.Fprintf(w, "(g) against redislock\t\t%.2f = (g)/(f)\t\t\n", co.off/co.lock)
	fmt.Fprintf(w, "Redis main thread busy during (e), (f), (g)\t%.0f%%, %.0f%%, %.0f%%\t\t\t\n", 100*co.busyOn, 100*co.busyLock, 100*co.busyOff)
	fmt.Fprintf(w, "(h) one caller: Acquire+Complete, coalescing on\t%s\t%.3f × off\t≤ 1.05\t\n", us(co.loneOn), float64(co.loneOn)/float64(co.loneOff))
	fmt.Fprintf(w, "(h) one caller: Acquire+Complete, CoalesceOff\t%s\t\t\t\n", us(co.loneOff))
	return w.Flush()
}

// coalesced holds the figures of (e) to (h), and the share of its time
// the server's main thread was busy during (e), (f) and (g).
type coalesced struct {
	on, off, lock             float64
	busyOn, busyOff, busyLock float64
	loneOn, loneOff           time.Duration
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
	var onRuns, offRuns, lockRuns, onBusy, offBusy, lockBusy []float64
	measure := func(runs, busy *[]float64, op func(context.Context, string) error) func() error {
		return func() error {
			cpu0, err := serverCPU(client)
			if err != nil {
				return err
			}
			start := time.Now()
			v, err := load.Cycles(deliveries, duration, op)
			if err != nil {
				return err
			}
			elapsed := time.Since(start)
			cpu1, err := serverCPU(client)
			if err != nil {
				return err
			}
			*runs = append(*runs, v)
			*busy = append(*busy, (cpu1-cpu0).Seconds()/elapsed.Seconds())
			return nil
		}
	}
	if err := load.Rounds(rounds,
		measure(&onRuns, &onBusy, load.StoreCycle(on)),
		measure(&lockRuns, &lockBusy, obtainRelease),
		measure(&offRuns, &offBusy, load.StoreCycle(off)),
	); err != nil {
		return r, err
	}
	r.on, r.off, r.lock = load.Median(onRuns), load.Median(offRuns), load.Median(lockRuns)
	r.busyOn, r.busyOff, r.busyLock = load.Median(onBusy), load.Median(offBusy), load.Median(lockBusy)
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
	res, err := store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: watermill.NewULID(), LeaseTTL: time.Minute, Retention: time.Hour})
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

// serverCPU is the CPU time the server's main thread has used (INFO cpu,
// Redis 6.2 and later), or the whole process's on an older server.
func serverCPU(c *redis.Client) (time.Duration, error) {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0, err
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
	secs, ok := fields["used_cpu_user_main_thread"]
	if ok {
		secs += fields["used_cpu_sys_main_thread"]
	} else {
		secs = fields["used_cpu_user"] + fields["used_cpu_sys"]
	}
	return time.Duration(secs * float64(time.Second)), nil
}
