package httpidem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/httpidem"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

type env struct {
	t      *testing.T
	store  backends.Store
	idem   *idempotency.Idempotency
	srv    *httptest.Server
	runs   atomic.Int32
	counts *idempotency.Counters

	mu   sync.Mutex
	keys []string // the full keys of the requests, as the engine saw them
}

// newEnv serves handler, wrapped by the middleware of cfg (its
// Idempotency set here on store, in namespace "api", changed by engine if
// given), at POST /orders and POST /refunds.
func newEnv(t *testing.T, store backends.Store, cfg httpidem.Config, handler func(e *env, w http.ResponseWriter, r *http.Request), engine ...func(*idempotency.Config)) *env {
	t.Helper()
	e := &env{t: t, store: store, counts: &idempotency.Counters{}}
	keys := idempotency.ObserverFunc(func(_ context.Context, ev idempotency.Event) {
		e.mu.Lock()
		e.keys = append(e.keys, ev.Key)
		e.mu.Unlock()
	})
	icfg := idempotency.Config{
		Store: store, Namespace: "api", LeaseTTL: time.Minute, Observer: idempotency.MultiObserver(e.counts, keys),
		Timing: idempotency.Timing{Poll: idempotency.Backoff{Initial: 5 * time.Millisecond}},
	}
	for _, f := range engine {
		f(&icfg)
	}
	var err error
	e.idem, err = idempotency.New(icfg)
	require.NoError(t, err)
	cfg.Idempotency = e.idem
	mw, err := httpidem.New(cfg)
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.runs.Add(1)
		handler(e, w, r)
	}))
	mux := http.NewServeMux()
	mux.Handle("POST /orders", h)
	mux.Handle("POST /refunds", h)
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	return e
}

// seenKeys returns the full keys of the requests so far.
func (e *env) seenKeys() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.keys)
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (e *env) post(path, key, body string, header ...string) reply {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	require.NoError(e.t, err)
	if key != "" {
		req.Header.Set(httpidem.Header, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// created answers 201 with a Location, a cookie and a body naming the run.
func created(e *env, w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	lease, ok := idempotency.LeaseFromContext(r.Context())
	if !ok {
		http.Error(w, "no lease", 500)
		return
	}
	w.Header().Set("Location", "/orders/"+strconv.FormatInt(lease.Token, 10))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Set-Cookie", "session=per-response")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"run":%d,"token":%d,"request":%q}`, e.runs.Load(), lease.Token, body)
}

func requireProblem(t *testing.T, r reply, status int) {
	t.Helper()
	requireProblemOfType(t, r, status, "about:blank")
}

func requireProblemOfType(t *testing.T, r reply, status int, typ string) {
	t.Helper()
	require.Equal(t, status, r.status, r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p struct {
		Type, Title, Detail string
		Status              int
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &p))
	require.Equal(t, status, p.Status)
	require.Equal(t, typ, p.Type)
	require.Equal(t, http.StatusText(status), p.Title)
	require.NotEmpty(t, p.Detail)
}

// retryAfter returns the reply's Retry-After in seconds, failing the test
// if it is missing or not a number.
func retryAfter(t *testing.T, r reply) int {
	t.Helper()
	secs, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After: %q", r.header.Get("Retry-After"))
	return secs
}

func TestReplay(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		e := newEnv(t, s.open(t), httpidem.Config{Required: true}, created)
		first := e.post("/orders", `"k-1"`, `{"amount":10}`)
		require.Equal(t, http.StatusCreated, first.status)
		require.Empty(t, first.header.Get(httpidem.ReplayedHeader))
		require.Equal(t, "session=per-response", first.header.Get("Set-Cookie"), "the first response is whole")

		again := e.post("/orders", `"k-1"`, `{"amount":10}`)
		require.Equal(t, int32(1), e.runs.Load(), "the handler ran once")
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, first.body, again.body)
		require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
		require.Equal(t, "application/json", again.header.Get("Content-Type"))
		require.Equal(t, "true", again.header.Get(httpidem.ReplayedHeader))
		require.Empty(t, again.header.Get("Set-Cookie"), "only the allowlisted headers are replayed")

		// A bare token is the same key as the quoted string.
		bare := e.post("/orders", `k-1`, `{"amount":10}`)
		require.Equal(t, first.body, bare.body)

		// The same key on another route is another key.
		other := e.post("/refunds", `"k-1"`, `{"amount":10}`)
		require.Equal(t, http.StatusCreated, other.status)
		require.Empty(t, other.header.Get(httpidem.ReplayedHeader))
		require.Equal(t, int32(2), e.runs.Load())

		rec, err := e.store.Inspect(t.Context(), "api:POST /orders||k-1")
		require.NoError(t, err)
		require.Equal(t, backends.StateCompleted, rec.State)
		require.Equal(t, `http="POST /orders"`, rec.Origin)
	})
}

func TestScope(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		e := newEnv(t, s.open(t), httpidem.Config{Scope: func(r *http.Request) (string, error) {
			tenant := r.Header.Get("Tenant")
			if tenant == "" {
				return "", fmt.Errorf("no tenant")
			}
			return tenant, nil
		}}, created)
		a := e.post("/orders", `"k"`, `{}`, "Tenant", "acme")
		b := e.post("/orders", `"k"`, `{}`, "Tenant", "globex")
		require.Equal(t, http.StatusCreated, a.status)
		require.Equal(t, http.StatusCreated, b.status)
		require.NotEqual(t, a.body, b.body)
		require.Equal(t, a.body, e.post("/orders", `"k"`, `{}`, "Tenant", "acme").body)
		require.Equal(t, int32(2), e.runs.Load())
		requireProblem(t, e.post("/orders", `"k"`, `{}`), http.StatusBadRequest)
		// A tenant whose name holds the separator does not reach another
		// tenant's keys.
		require.Equal(t, http.StatusCreated, e.post("/orders", `"k"`, `{}`, "Tenant", "a|b").status)
		require.Equal(t, http.StatusCreated, e.post("/orders", `"b|k"`, `{}`, "Tenant", "a").status)
		require.Equal(t, int32(4), e.runs.Load())
	})
}

// Keys whose parts are long are hashed to fit every store, and stay
// apart.
func TestLongKeysAreHashed(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		long := strings.Repeat("t", 3000)
		e := newEnv(t, s.open(t), httpidem.Config{Scope: func(r *http.Request) (string, error) {
			return long + r.Header.Get("Tenant"), nil
		}}, created)
		key := `"` + strings.Repeat("k", httpidem.DefaultMaxKeyBytes) + `"`
		a := e.post("/orders", key, `{}`, "Tenant", "a")
		b := e.post("/orders", key, `{}`, "Tenant", "b")
		require.Equal(t, http.StatusCreated, a.status, a.body)
		require.Equal(t, http.StatusCreated, b.status, b.body)
		require.NotEqual(t, a.body, b.body, "two scopes, two keys")
		replay := e.post("/orders", key, `{}`, "Tenant", "a")
		require.Equal(t, a.body, replay.body)
		require.Equal(t, "true", replay.header.Get(httpidem.ReplayedHeader))
		for _, k := range e.seenKeys() {
			require.LessOrEqual(t, len(k), idempotency.DefaultMaxKeyBytes)
			require.True(t, strings.HasPrefix(k, "api:sha256:"), k)
		}

		// A namespace that leaves little room: the whole key is hashed.
		ns := strings.Repeat("n", idempotency.DefaultMaxKeyBytes-80)
		narrow := newEnv(t, s.open(t), httpidem.Config{}, created, func(c *idempotency.Config) { c.Namespace = ns })
		first := narrow.post("/orders", key, `{}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		require.Equal(t, first.body, narrow.post("/orders", key, `{}`).body)
		require.Equal(t, int32(1), narrow.runs.Load())
	})
}

func TestMissingAndInvalidKeys(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		required := newEnv(t, s.open(t), httpidem.Config{Required: true, MaxKeyBytes: 16}, created)
		requireProblem(t, required.post("/orders", "", `{}`), http.StatusBadRequest)
		for _, bad := range []string{`"unterminated`, `"a\b"`, `a b`, `""`, `"` + strings.Repeat("x", 17) + `"`,
			`"tab` + "\t" + `"`, `"a", "b"`, `"a";p=1`, `a,b`, "\"caf\xc3\xa9\""} {
			requireProblem(t, required.post("/orders", bad, `{}`), http.StatusBadRequest)
		}
		requireProblem(t, required.post("/orders", `"a"`, `{}`, httpidem.Header, `"b"`), http.StatusBadRequest)
		require.Zero(t, required.runs.Load())
		require.Equal(t, http.StatusCreated, required.post("/orders", `"with \"escapes\" \\"`, `{}`).status)
		require.Equal(t, http.StatusCreated, required.post("/orders", `"`+strings.Repeat("x", 16)+`"`, `{}`).status)

		optional := newEnv(t, s.open(t), httpidem.Config{}, created)
		for range 2 {
			r := optional.post("/orders", "", `{}`)
			require.Equal(t, http.StatusInternalServerError, r.status)
			require.Equal(t, "no lease\n", r.body, "without a key, a request passes through, unprotected")
		}
		require.Equal(t, int32(2), optional.runs.Load())
		require.Empty(t, optional.seenKeys(), "nothing reached the store")
	})
}

func TestFingerprint(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		logger := watermill.NewCaptureLogger()
		e := newEnv(t, s.open(t), httpidem.Config{}, created, func(c *idempotency.Config) { c.Logger = logger })
		require.Equal(t, http.StatusCreated, e.post("/orders", `"k"`, `{"amount":10}`).status)
		requireProblem(t, e.post("/orders", `"k"`, `{"amount":99}`), http.StatusUnprocessableEntity)
		requireProblem(t, e.post("/orders?dry_run=1", `"k"`, `{"amount":10}`), http.StatusUnprocessableEntity)
		require.Equal(t, int32(1), e.runs.Load())
		require.Empty(t, logger.Captured()[watermill.ErrorLogLevel], "a 422 answers the client: not an error of the service's")
		require.Len(t, logger.Captured()[watermill.DebugLogLevel], 2, "each 422 at debug level")

		// A fingerprint of the application's choosing, and a problem type
		// of its own.
		const typ = "https://api.example.com/problems/idempotency"
		custom := newEnv(t, s.open(t), httpidem.Config{ProblemType: typ, Fingerprint: func(r *http.Request, body []byte) (string, error) {
			var req struct{ Amount int }
			if err := json.Unmarshal(body, &req); err != nil {
				return "", err
			}
			return strconv.Itoa(req.Amount), nil
		}}, created)
		first := custom.post("/orders", `"k"`, `{"amount":10,"note":"a"}`)
		require.Equal(t, http.StatusCreated, first.status)
		require.Equal(t, first.body, custom.post("/orders", `"k"`, `{"amount":10,"note":"b"}`).body, "only the amount must agree")
		requireProblemOfType(t, custom.post("/orders", `"k"`, `{"amount":11}`), http.StatusUnprocessableEntity, typ)
		requireProblemOfType(t, custom.post("/orders", `"k"`, `not json`), http.StatusBadRequest, typ)
		require.Equal(t, int32(1), custom.runs.Load())
	})
}

func TestStatusesStoredOrReleased(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		var status atomic.Int32
		e := newEnv(t, s.open(t), httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(int(status.Load()))
			fmt.Fprintf(w, "run %d", e.runs.Load())
		})
		for _, tc := range []struct {
			status int
			stored bool
		}{{200, true}, {303, true}, {400, true}, {404, true}, {408, false}, {409, false}, {425, false}, {429, false}, {500, false}, {503, false}} {
			status.Store(int32(tc.status))
			key := fmt.Sprintf(`"k-%d"`, tc.status)
			before := e.runs.Load()
			first := e.post("/orders", key, "")
			require.Equal(t, tc.status, first.status)
			status.Store(201)
			second := e.post("/orders", key, "")
			if tc.stored {
				require.Equal(t, tc.status, second.status, "status %d is replayed", tc.status)
				require.Equal(t, first.body, second.body)
				require.Equal(t, before+1, e.runs.Load())
			} else {
				require.Equal(t, 201, second.status, "status %d released the key", tc.status)
				require.Equal(t, before+2, e.runs.Load())
			}
		}
	})
}

func TestInProgress(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		for _, policy := range []httpidem.InProgressPolicy{httpidem.Conflict, httpidem.Wait} {
			t.Run(strconv.Itoa(int(policy)), func(t *testing.T) {
				started, finish := make(chan struct{}), make(chan struct{})
				var once sync.Once
				e := newEnv(t, s.open(t), httpidem.Config{InProgress: policy}, func(e *env, w http.ResponseWriter, r *http.Request) {
					once.Do(func() { close(started) })
					<-finish
					created(e, w, r)
				})
				release := sync.OnceFunc(func() { close(finish) })
				defer release() // a failed test does not leave the handler waiting
				firstDone := make(chan reply, 1)
				go func() { firstDone <- e.post("/orders", `"k"`, `{}`) }()
				<-started
				if policy == httpidem.Conflict {
					r := e.post("/orders", `"k"`, `{}`)
					requireProblem(t, r, http.StatusConflict)
					secs := retryAfter(t, r)
					require.GreaterOrEqual(t, secs, 1)
					require.LessOrEqual(t, secs, 60, "at most the holder's lease")
					require.Zero(t, e.counts.Waited(), "a conflict is answered at once, without waiting")
					release()
					<-firstDone
					return
				}
				waited := make(chan reply, 1)
				go func() { waited <- e.post("/orders", `"k"`, `{}`) }()
				// Whether it arrives before or after the completion, the
				// duplicate must get the original's response.
				time.Sleep(50 * time.Millisecond)
				release()
				first, second := <-firstDone, <-waited
				require.Equal(t, first.body, second.body)
				require.Equal(t, "true", second.header.Get(httpidem.ReplayedHeader))
				require.Equal(t, int32(1), e.runs.Load())
			})
		}
	})
}

// With Wait, a request whose original still runs when the wait ends gets
// 409 Conflict too.
func TestWaitEndsInConflict(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		started, finish := make(chan struct{}), make(chan struct{})
		var once sync.Once
		e := newEnv(t, s.open(t), httpidem.Config{InProgress: httpidem.Wait}, func(e *env, w http.ResponseWriter, r *http.Request) {
			once.Do(func() { close(started) })
			<-finish
			created(e, w, r)
		}, func(c *idempotency.Config) { c.Timing.InProgressWait = 20 * time.Millisecond })
		release := sync.OnceFunc(func() { close(finish) })
		defer release()
		firstDone := make(chan reply, 1)
		go func() { firstDone <- e.post("/orders", `"k"`, `{}`) }()
		<-started
		r := e.post("/orders", `"k"`, `{}`)
		requireProblem(t, r, http.StatusConflict)
		require.GreaterOrEqual(t, retryAfter(t, r), 1)
		require.Equal(t, int64(1), e.counts.Waited(), "the request waited first")
		release()
		require.Equal(t, http.StatusCreated, (<-firstDone).status)
		require.Equal(t, int32(1), e.runs.Load())
	})
}

func TestLimits(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		e := newEnv(t, s.open(t), httpidem.Config{MaxRequestBytes: 8, MaxResponseBytes: 64}, func(e *env, w http.ResponseWriter, r *http.Request) {
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			body, _ := io.ReadAll(r.Body)
			w.WriteHeader(200)
			_, _ = w.Write(body)
			for range n {
				_, _ = w.Write([]byte("0123456789"))
			}
		})
		requireProblem(t, e.post("/orders", `"big"`, "123456789"), http.StatusRequestEntityTooLarge)
		require.Zero(t, e.runs.Load())
		// A body within the limit reaches the handler whole, after the
		// middleware read it.
		require.Equal(t, "12345678", e.post("/orders", `"small"`, "12345678").body)

		// A response past the limit reaches the client whole, and is not
		// stored: the retry runs again.
		big := e.post("/orders?n=100", `"out"`, "")
		require.Equal(t, 200, big.status)
		require.Len(t, big.body, 1000)
		require.Len(t, e.post("/orders?n=100", `"out"`, "").body, 1000)
		require.Equal(t, int32(3), e.runs.Load())
		require.Equal(t, int64(2), e.counts.Count(idempotency.OutcomeHandlerFailed))
	})
}

func TestPanicReleases(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		var panicked atomic.Bool
		e := newEnv(t, s.open(t), httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
			if panicked.CompareAndSwap(false, true) {
				panic(http.ErrAbortHandler)
			}
			created(e, w, r)
		})
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", nil)
		req.Header.Set(httpidem.Header, `"k"`)
		_, err := e.srv.Client().Do(req)
		require.Error(t, err, "the server aborted the response")
		require.Equal(t, http.StatusCreated, e.post("/orders", `"k"`, "").status, "the key was released")
	})
}

func TestClientLeaves(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		// A handler that gives up with its client: the key is released.
		var finishes atomic.Bool
		entered := make(chan struct{}, 2)
		e := newEnv(t, s.open(t), httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
			if !finishes.Load() {
				entered <- struct{}{}
				<-r.Context().Done()
				return
			}
			entered <- struct{}{}
			time.Sleep(50 * time.Millisecond) // the client is gone meanwhile; the work goes on
			created(e, w, r)
		})
		leave := func(key string) {
			ctx, cancel := context.WithCancel(t.Context())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/orders", nil)
			req.Header.Set(httpidem.Header, key)
			go func() { <-entered; cancel() }()
			_, err := e.srv.Client().Do(req)
			require.Error(t, err)
		}
		leave(`"gives-up"`)
		require.Eventually(t, func() bool {
			rec, err := e.store.Inspect(t.Context(), "api:POST /orders||gives-up")
			return err == nil && rec.State == backends.StateReleased
		}, time.Minute, time.Millisecond, "the key is released, not held until its lease runs out")

		// A handler that finishes its work anyway: the key is completed,
		// and the retry gets its response.
		finishes.Store(true)
		leave(`"finishes"`)
		require.Eventually(t, func() bool {
			rec, err := e.store.Inspect(t.Context(), "api:POST /orders||finishes")
			return err == nil && rec.State == backends.StateCompleted
		}, time.Minute, time.Millisecond)
		r := e.post("/orders", `"finishes"`, "")
		require.Equal(t, http.StatusCreated, r.status)
		require.Equal(t, "true", r.header.Get(httpidem.ReplayedHeader))
	})
}

// failingStore refuses every Acquire while fail is set, as a store whose
// table is gone does.
type failingStore struct {
	backends.Store
	fail atomic.Bool
}

func (f *failingStore) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	if f.fail.Load() {
		return backends.AcquireResult{}, fmt.Errorf("%w: injected failure", backends.ErrRejected)
	}
	return f.Store.Acquire(ctx, req)
}

// A store that fails before the handler runs: 503 with Retry-After, and
// the handler does not run.
func TestStoreFailure(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		store := &failingStore{Store: s.open(t)}
		store.fail.Store(true)
		e := newEnv(t, store, httpidem.Config{}, created)
		r := e.post("/orders", `"k"`, `{}`)
		requireProblem(t, r, http.StatusServiceUnavailable)
		require.GreaterOrEqual(t, retryAfter(t, r), 1)
		require.Zero(t, e.runs.Load())
		store.fail.Store(false)
		require.Equal(t, http.StatusCreated, e.post("/orders", `"k"`, `{}`).status)
	})
}

// A handler whose lease is lost while it runs (here: an operator deletes
// its key) sees its context cancelled; its response is not sent, the
// client gets 503 and its retry runs again.
func TestLeaseLost(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		entered, testDone := make(chan struct{}), make(chan struct{})
		defer close(testDone) // a failed test does not leave the handler waiting
		var cause atomic.Value
		e := newEnv(t, s.open(t), httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
			if e.runs.Load() == 1 {
				close(entered)
				select {
				case <-r.Context().Done():
					cause.Store(context.Cause(r.Context()))
				case <-testDone:
				}
			}
			created(e, w, r)
		}, func(c *idempotency.Config) { c.LeaseTTL = 300 * time.Millisecond })
		done := make(chan reply, 1)
		go func() { done <- e.post("/orders", `"k"`, `{}`) }()
		<-entered
		require.NoError(t, e.store.Delete(t.Context(), "api:POST /orders||k"))
		r := <-done
		requireProblem(t, r, http.StatusServiceUnavailable)
		require.GreaterOrEqual(t, retryAfter(t, r), 1)
		cerr, _ := cause.Load().(error)
		require.ErrorIs(t, cerr, backends.ErrLeaseLost, "the handler's context says why")
		require.Equal(t, int64(1), e.counts.Count(idempotency.OutcomeLeaseLost))

		again := e.post("/orders", `"k"`, `{}`)
		require.Equal(t, http.StatusCreated, again.status)
		require.Empty(t, again.header.Get(httpidem.ReplayedHeader), "nothing was stored: the retry ran")
		require.Equal(t, int32(2), e.runs.Load())
	})
}

// A key of the namespace that holds something else than a response
// (completed by another door, or corrupt): 500, not a 503 to retry for
// ever.
func TestUnreadableStoredResponse(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		e := newEnv(t, s.open(t), httpidem.Config{}, created)
		res, err := e.store.Acquire(t.Context(), backends.AcquireRequest{Key: "api:POST /orders||k", Owner: "other-door", LeaseTTL: time.Minute, Retention: time.Hour})
		require.NoError(t, err)
		require.NoError(t, e.store.Complete(t.Context(), res.Lease, []byte(`{"not":"a response"}`)))
		requireProblem(t, e.post("/orders", `"k"`, `{}`), http.StatusInternalServerError)
		require.Zero(t, e.runs.Load())
	})
}

// The recorder works with http.ResponseController: deadlines reach the
// client's connection, Flush keeps the response whole, Hijack is refused.
func TestResponseController(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		var hijack, deadline, flush error
		e := newEnv(t, s.open(t), httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			var conn net.Conn
			if conn, _, hijack = rc.Hijack(); conn != nil {
				_ = conn.Close() // the test fails; let the client know at once
				return
			}
			deadline = rc.SetWriteDeadline(time.Now().Add(time.Minute))
			w.WriteHeader(http.StatusAccepted)
			_, _ = w.Write([]byte("a"))
			flush = rc.Flush()
			_, _ = w.Write([]byte("b"))
		})
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", nil)
		req.Header.Set(httpidem.Header, `"k"`)
		resp, err := e.srv.Client().Do(req)
		require.ErrorIs(t, hijack, http.ErrNotSupported)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusAccepted, resp.StatusCode)
		require.Equal(t, "ab", string(body))
		require.NoError(t, deadline, "the deadline is the client connection's")
		require.NoError(t, flush)
		again := e.post("/orders", `"k"`, "")
		require.Equal(t, http.StatusAccepted, again.status)
		require.Equal(t, "true", again.header.Get(httpidem.ReplayedHeader))
		require.Equal(t, "ab", again.body, "what was written after the flush is stored too")
		require.Equal(t, int32(1), e.runs.Load())
	})
}

// TestCompletionOutputIsTheResponse: a handler that completes its own key
// (as contrib/sqloutbox's WithTx does, in its transaction) records the
// response written so far, and the retry replays it.
func TestCompletionOutputIsTheResponse(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		e := newEnv(t, s.open(t), httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", "/orders/7")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"order":7}`))
			out, err := idempotency.CompletionOutput(r.Context())
			require.NoError(e.t, err)
			lease, _ := idempotency.LeaseFromContext(r.Context())
			require.NoError(e.t, e.store.Complete(r.Context(), lease, out)) // the transaction's commit
		})
		first := e.post("/orders", `"k"`, "")
		second := e.post("/orders", `"k"`, "")
		require.Equal(t, int32(1), e.runs.Load())
		require.Equal(t, http.StatusCreated, second.status)
		require.Equal(t, `{"order":7}`, second.body)
		require.Equal(t, first.body, second.body)
		require.Equal(t, "/orders/7", second.header.Get("Location"))
		require.Equal(t, "true", second.header.Get(httpidem.ReplayedHeader))
		require.Equal(t, int64(1), e.counts.Count(idempotency.OutcomeProcessed))
	})
}

// On Postgres, the order row, the key's completion and the 201 commit in
// one transaction (pgstore.CompleteTxOutput with CompletionOutput); a
// transaction that fails leaves nothing, and its retry runs.
func TestCompletionInTheHandlersTransaction(t *testing.T) {
	store, pool := newPgStore(t)
	table := fmt.Sprintf("httpidem_orders_%d", time.Now().UnixNano())
	_, err := pool.Exec(t.Context(), `CREATE TABLE `+table+` (key text, token bigint)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE `+table) })
	var fail atomic.Bool
	fail.Store(true)
	e := newEnv(t, store, httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		lease, _ := idempotency.LeaseFromContext(ctx)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, $2)`, lease.Key, lease.Token); err != nil {
				return err
			}
			w.Header().Set("Location", "/orders/"+strconv.FormatInt(lease.Token, 10))
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "order %d", lease.Token)
			out, err := idempotency.CompletionOutput(ctx)
			if err != nil {
				return err
			}
			if err := store.CompleteTxOutput(ctx, tx, lease, out); err != nil {
				return err
			}
			if fail.Load() {
				return errors.New("the commit failed")
			}
			return nil
		})
		if err != nil {
			require.True(e.t, httpidem.Reset(w))
			http.Error(w, "try again", http.StatusServiceUnavailable)
		}
	})
	rows := func() int {
		var n int
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM `+table).Scan(&n))
		return n
	}
	r := e.post("/orders", `"k"`, "")
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Zero(t, rows(), "the transaction rolled back")
	fail.Store(false)
	first := e.post("/orders", `"k"`, "")
	require.Equal(t, http.StatusCreated, first.status, first.body)
	again := e.post("/orders", `"k"`, "")
	require.Equal(t, first.body, again.body)
	require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
	require.Equal(t, "true", again.header.Get(httpidem.ReplayedHeader))
	require.Equal(t, 1, rows(), "one order row")
	require.Equal(t, int32(2), e.runs.Load())
	require.Equal(t, map[string]int64{"handler_failed": 1, "processed": 1, "duplicate": 1}, e.counts.Snapshot(),
		"one failure, one completion in the transaction, one replay")
}

func TestInvalidConfig(t *testing.T) {
	_, err := httpidem.New(httpidem.Config{})
	require.ErrorIs(t, err, httpidem.ErrInvalidConfig)
	store, err := memstore.New(memstore.Options{})
	require.NoError(t, err)
	noNS, err := idempotency.New(idempotency.Config{Store: store})
	require.NoError(t, err)
	_, err = httpidem.New(httpidem.Config{Idempotency: noNS})
	require.ErrorIs(t, err, httpidem.ErrInvalidConfig)
	require.ErrorContains(t, err, "Namespace")
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "api"})
	require.NoError(t, err)
	_, err = httpidem.New(httpidem.Config{Idempotency: idem, InProgress: 7, MaxKeyBytes: -1, MaxRequestBytes: -1, MaxResponseBytes: 1 << 30})
	require.ErrorIs(t, err, httpidem.ErrInvalidConfig)
	for _, want := range []string{"InProgress", "MaxKeyBytes", "MaxRequestBytes", "MaxResponseBytes"} {
		require.ErrorContains(t, err, want)
	}
	// A namespace that leaves no room for a hashed key.
	wide, err := idempotency.New(idempotency.Config{Store: store, Namespace: strings.Repeat("n", idempotency.DefaultMaxKeyBytes-64)})
	require.NoError(t, err)
	_, err = httpidem.New(httpidem.Config{Idempotency: wide})
	require.ErrorIs(t, err, httpidem.ErrInvalidConfig)
	require.ErrorContains(t, err, "MaxKeyBytes")

	// New works on its own copy.
	cfg := httpidem.Config{Idempotency: idem}
	_, err = httpidem.New(cfg)
	require.NoError(t, err)
	require.Equal(t, httpidem.Config{Idempotency: idem}, cfg)
}

// TestReset: a response written inside a transaction that then fails is
// discarded, and the error response released the key.
func TestReset(t *testing.T) {
	eachStore(t, func(t *testing.T, s storeCase) {
		var fail atomic.Bool
		fail.Store(true)
		e := newEnv(t, s.open(t), httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", "/orders/1")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("created"))
			if fail.Load() { // the transaction failed
				require.True(e.t, httpidem.Reset(w))
				http.Error(w, "try again", http.StatusServiceUnavailable)
			}
		})
		r := e.post("/orders", `"k"`, "")
		require.Equal(t, http.StatusServiceUnavailable, r.status)
		require.Equal(t, "try again\n", r.body)
		require.Empty(t, r.header.Get("Location"))
		fail.Store(false)
		r = e.post("/orders", `"k"`, "")
		require.Equal(t, http.StatusCreated, r.status, "the 503 released the key")
		require.Equal(t, "created", r.body)
		require.False(t, httpidem.Reset(httptest.NewRecorder()), "not a writer of the middleware")
	})
}
