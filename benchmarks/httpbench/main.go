// Command httpbench measures what package httpidem costs per request,
// against the same handler without it and against the middleware a team
// writes by hand (SET NX the key, run, SET the response; no renewal, no
// fencing, no fingerprint), in one run:
//
//   - plain: the handler alone;
//   - httpidem/memstore: the middleware on the in-memory store;
//   - httpidem/redis: the middleware on the Redis store;
//   - setnx/redis: the hand-written middleware on the same Redis.
//
// Each serves POST /orders on a loopback HTTP server; -c clients send -n
// requests with new keys (the handler runs), then the same keys again
// (replays). It reports requests per second, client latency p50 and p99,
// and the CPU time of the process (clients, server and middleware; Redis
// apart) per request, and each variant's overhead over plain. Rounds are
// interleaved; the median round is reported.
//
//	go run ./httpbench -redis 127.0.0.1:6379
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/httpidem"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

func main() {
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address")
	n := flag.Int("n", 10000, "requests per phase (new keys, then replays)")
	c := flag.Int("c", 16, "concurrent clients")
	rounds := flag.Int("rounds", 3, "rounds; the median is reported")
	flag.Parse()
	if err := run(*redisAddr, *n, *c, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "httpbench:", err)
		os.Exit(1)
	}
}

type variant struct {
	name    string
	handler http.Handler
}

// result is one phase of one round of one variant.
type result struct {
	rps      float64
	p50, p99 time.Duration
	cpu      time.Duration // per request
}

func run(redisAddr string, n, c, rounds int) error {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 4 * c})
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", redisAddr, err)
	}
	prefix := "httpbench:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	mem, err := memstore.New(memstore.Options{})
	if err != nil {
		return err
	}
	rs, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	if err != nil {
		return err
	}
	withStore := func(store backends.Store) (http.Handler, error) {
		idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "orders-api"})
		if err != nil {
			return nil, err
		}
		mw, err := httpidem.New(httpidem.Config{Idempotency: idem, Required: true})
		if err != nil {
			return nil, err
		}
		return mw.Handler(http.HandlerFunc(createOrder)), nil
	}
	onMem, err := withStore(mem)
	if err != nil {
		return err
	}
	onRedis, err := withStore(rs)
	if err != nil {
		return err
	}
	variants := []variant{
		{"plain", http.HandlerFunc(createOrder)},
		{"httpidem/memstore", onMem},
		{"httpidem/redis", onRedis},
		{"setnx/redis", setnx(client, prefix+"setnx:", 30*time.Second, 24*time.Hour, http.HandlerFunc(createOrder))},
	}
	fmt.Printf("httpbench: %d requests per phase, %d clients, %d rounds, Redis %s\n\n", n, c, rounds, redisAddr)

	phases := []string{"new key", "replay"}
	got := map[string][][]result{} // variant -> phase -> rounds
	for round := range rounds {
		for _, v := range variants {
			srv := httptest.NewServer(v.handler)
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c, MaxConnsPerHost: c}}
			keyBase := fmt.Sprintf("%s-r%d-", strings.ReplaceAll(v.name, "/", "-"), round)
			if got[v.name] == nil {
				got[v.name] = make([][]result, len(phases))
			}
			for p := range phases {
				res, err := phase(hc, srv.URL+"/orders", keyBase, n, c, p == 1)
				if err != nil {
					srv.Close()
					return fmt.Errorf("%s, %s: %w", v.name, phases[p], err)
				}
				got[v.name][p] = append(got[v.name][p], res)
			}
			hc.CloseIdleConnections()
			srv.Close()
		}
	}

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\tphase\treq/s\tp50\tp99\tCPU/req\tCPU over plain\tp50 over plain\t")
	for p, ph := range phases {
		base := median(got["plain"][p])
		for _, v := range variants {
			m := median(got[v.name][p])
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", v.name, ph, m.rps, us(m.p50), us(m.p99), us(m.cpu), us(m.cpu-base.cpu), us(m.p50-base.p50))
		}
	}
	_ = tw.Flush()
	for p, ph := range phases {
		a, b := median(got["httpidem/redis"][p]), median(got["setnx/redis"][p])
		fmt.Printf("\n%s: httpidem/redis %.2f× the requests/s of setnx/redis, %.2f× its CPU per request", ph, a.rps/b.rps, float64(a.cpu)/float64(b.cpu))
	}
	fmt.Println()
	return nil
}

// phase sends n requests from c clients, keys keyBase + 0 … n-1, and
// checks every answer: 201, and marked replayed if replay.
func phase(hc *http.Client, url, keyBase string, n, c int, replay bool) (result, error) {
	var next atomic.Int64
	lat := make([]time.Duration, n)
	var firstErr error
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"item":"book","amount":1200}`))
				req.Header.Set(httpidem.Header, `"`+keyBase+strconv.Itoa(i)+`"`)
				t := time.Now()
				resp, err := hc.Do(req)
				if err != nil {
					fail(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				lat[i] = time.Since(t)
				if resp.StatusCode != http.StatusCreated {
					fail(fmt.Errorf("status %d", resp.StatusCode))
					return
				}
				if replayed := resp.Header.Get(httpidem.ReplayedHeader) == "true"; replayed != replay && !strings.HasPrefix(keyBase, "plain") {
					fail(fmt.Errorf("replayed %v, want %v", replayed, replay))
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return result{}, firstErr
	}
	cpu := cpuTime() - cpu0
	slices.Sort(lat)
	return result{
		rps: float64(n) / elapsed.Seconds(),
		p50: lat[n/2], p99: lat[n*99/100],
		cpu: cpu / time.Duration(n),
	}, nil
}

// createOrder is the handler every variant serves.
func createOrder(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/o-1")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"o-1","bytes":%d}`, len(body))
}

// setnx is the middleware a team writes by hand: SET NX the key with a
// TTL, run the handler, SET the response (status and body) for the
// retention, or DEL the key after a 5xx. A key that exists without a
// response is in progress: 409. No renewal, no fencing token, no
// fingerprint, no replayed headers.
func setnx(rdb *redis.Client, prefix string, ttl, retention time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(httpidem.Header)
		if key == "" {
			http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		k := prefix + key
		ok, err := rdb.SetNX(ctx, k, "", ttl).Result()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if !ok {
			v, err := rdb.Get(ctx, k).Bytes()
			switch {
			case errors.Is(err, redis.Nil), err == nil && len(v) == 0:
				http.Error(w, "in progress", http.StatusConflict)
			case err != nil:
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
			default:
				status, body, _ := bytes.Cut(v, []byte("\n"))
				code, _ := strconv.Atoi(string(status))
				w.Header().Set(httpidem.ReplayedHeader, "true")
				w.WriteHeader(code)
				_, _ = w.Write(body)
			}
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		if rec.Code >= 500 {
			rdb.Del(ctx, k)
		} else {
			rdb.Set(ctx, k, strconv.Itoa(rec.Code)+"\n"+rec.Body.String(), retention)
		}
		for h, v := range rec.Header() {
			w.Header()[h] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

func median(rs []result) result {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b result) int { return int(a.rps - b.rps) })
	return s[len(s)/2]
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1e3) }

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
