package httpidem_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/httpidem"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
	"github.com/watermill-idempotency/idempotency/storetest"
)

// The storm's server processes are this test binary, run again with
// stormEnvVar set to their settings (JSON).
const stormEnvVar = "HTTPIDEM_STORM_SERVER"

type stormServer struct {
	Store     string // "redis" or "postgres"
	Addr      string // REDIS_ADDR or TEST_DATABASE_URL
	Prefix    string // the Redis key prefix or the Postgres schema
	Namespace string
	Sink      string // the URL the handlers apply their effects at
	Wait      bool   // InProgress: Wait, not Conflict
}

func TestMain(m *testing.M) {
	if v := os.Getenv(stormEnvVar); v != "" {
		var s stormServer
		if err := json.Unmarshal([]byte(v), &s); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := s.serve(); err != nil {
			fmt.Fprintln(os.Stderr, "storm server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serve runs one server process until SIGTERM: the middleware on the
// shared store, and a handler that applies its key's effect at the sink,
// fenced by its lease's token. It prints "ADDR <host:port>" once it
// listens.
func (s stormServer) serve() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var store backends.Store
	switch s.Store {
	case "redis":
		client := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 32})
		defer client.Close()
		rs, err := redisstore.New(client, redisstore.Options{Prefix: s.Prefix})
		if err != nil {
			return err
		}
		store = rs
	case "postgres":
		pool, err := pgxpool.New(ctx, s.Addr)
		if err != nil {
			return err
		}
		defer pool.Close()
		ps, err := pgstore.New(pool, pgstore.Options{Schema: s.Prefix})
		if err != nil {
			return err
		}
		defer ps.Close()
		store = ps
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: s.Namespace, LeaseTTL: 30 * time.Second})
	if err != nil {
		return err
	}
	policy := httpidem.Conflict
	if s.Wait {
		policy = httpidem.Wait
	}
	mw, err := httpidem.New(httpidem.Config{Idempotency: idem, Required: true, InProgress: policy})
	if err != nil {
		return err
	}
	handler := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lease, _ := idempotency.LeaseFromContext(r.Context())
		body, _ := json.Marshal(lease)
		resp, err := http.Post(s.Sink, "application/json", strings.NewReader(string(body)))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			http.Error(w, "the sink refused the effect", http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "applied by pid %d with token %d", os.Getpid(), lease.Token)
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	fmt.Printf("ADDR %s\n", ln.Addr())
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// TestStormTwoProcesses: 50 concurrent requests for each key, spread over
// two server processes on one store, run each key's effect exactly once,
// as a fenced sink counts it, and every client gets the one response;
// with the Conflict policy (the clients retry on 409) and with Wait (the
// servers wait for the original, woken across processes by the store).
func TestStormTwoProcesses(t *testing.T) {
	for _, name := range []string{"redis", "postgres"} {
		for _, wait := range []bool{false, true} {
			policy := "conflict"
			if wait {
				policy = "wait"
			}
			t.Run(name+"/"+policy, func(t *testing.T) {
				t.Parallel()
				stormOn(t, stormServer{Store: name, Namespace: "storm", Prefix: testserver.Unique("httpidem-storm:"), Wait: wait})
			})
		}
	}
}

// stormOn readies s's store, then runs the storm on it.
func stormOn(t *testing.T, s stormServer) {
	switch s.Store {
	case "redis":
		testserver.RedisClient(t)
		s.Addr = testserver.Service(t, "REDIS_ADDR")
	case "postgres":
		pool := testserver.PostgresPool(t)
		s.Addr = testserver.PostgresURL(t)
		s.Prefix = fmt.Sprintf("httpidem_storm_%d_%d", time.Now().UnixNano(), schemaSeq.Add(1))
		ps, err := pgstore.New(pool, pgstore.Options{Schema: s.Prefix})
		require.NoError(t, err)
		require.NoError(t, ps.Migrate(t.Context()))
		t.Cleanup(func() {
			_, err := pool.Exec(context.Background(), `DROP SCHEMA `+s.Prefix+` CASCADE`)
			require.NoError(t, err)
		})
	}
	runStorm(t, s)
}

func runStorm(t *testing.T, s stormServer) {
	const keys, copies = 6, 50
	sink := storetest.NewSink()
	var applies atomic.Int64
	sinkSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var l backends.Lease
		if err := json.NewDecoder(r.Body).Decode(&l); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		applies.Add(1)
		if err := sink.Apply(l); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
		}
	}))
	defer sinkSrv.Close()
	s.Sink = sinkSrv.URL

	var addrs []string
	for range 2 {
		addrs = append(addrs, startServer(t, s))
	}

	type result struct {
		status   int
		body     string
		replayed bool
		tries    int
	}
	results := make([][]result, keys)
	var mu sync.Mutex
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: copies}}
	deadline := time.Now().Add(3 * time.Minute)
	for k := range keys {
		for c := range copies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var res result
				for time.Now().Before(deadline) {
					res.tries++
					req, _ := http.NewRequest(http.MethodPost, "http://"+addrs[(k+c)%2]+"/orders", strings.NewReader(`{"order":1}`))
					req.Header.Set(httpidem.Header, fmt.Sprintf(`"order-%d"`, k))
					resp, err := client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					b, _ := io.ReadAll(resp.Body)
					_ = resp.Body.Close()
					res.status, res.body, res.replayed = resp.StatusCode, string(b), resp.Header.Get(httpidem.ReplayedHeader) == "true"
					if resp.StatusCode != http.StatusConflict {
						break
					}
					// In progress: come back soon (sooner than Retry-After,
					// to keep the test short).
					time.Sleep(time.Duration(10+rand.IntN(40)) * time.Millisecond)
				}
				mu.Lock()
				results[k] = append(results[k], res)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()

	tally, refused, err := sink.Tally()
	require.NoError(t, err)
	require.Len(t, tally, keys)
	var conflicts, replays int
	for key, tl := range tally {
		require.Equal(t, 1, tl.Applied, "%s: fenced effects applied", key)
	}
	// With a lease far longer than any pause here, the handler ran once
	// per key: every other request was answered 409 or replayed.
	require.Equal(t, int64(keys), applies.Load(), "handler runs")
	for k := range keys {
		require.Len(t, results[k], copies)
		first := results[k][0]
		originals := 0
		for _, r := range results[k] {
			require.Equal(t, http.StatusCreated, r.status, "key %d: %s", k, r.body)
			require.Equal(t, first.body, r.body, "key %d: every client gets the one response", k)
			if r.replayed {
				replays++
			} else {
				originals++
			}
			conflicts += r.tries - 1
		}
		require.Equal(t, 1, originals, "key %d: one response is the original, the others replays", k)
	}
	t.Logf("%s, wait=%v: %d keys × %d concurrent requests over 2 processes: %d fenced effects applied (one per key), %d refused as stale, %d attempts at the sink; %d replays, %d answers 409 retried",
		s.Store, s.Wait, keys, copies, keys, refused, applies.Load(), replays, conflicts)
}

// startServer starts a server process and returns its address; it is
// stopped when the test ends.
func startServer(t *testing.T, s stormServer) string {
	t.Helper()
	env, err := json.Marshal(s)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), stormEnvVar+"="+string(env))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the server process did not start")
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "ADDR ")
	require.True(t, ok, "the server process said %q", line)
	return addr
}
