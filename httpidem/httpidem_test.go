package httpidem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
}

// newEnv serves handler, wrapped by the middleware of cfg (its
// Idempotency set here on memstore), at POST /orders and POST /refunds.
func newEnv(t *testing.T, cfg httpidem.Config, handler func(e *env, w http.ResponseWriter, r *http.Request)) *env {
	t.Helper()
	store, err := memstore.New(memstore.Options{})
	require.NoError(t, err)
	e := &env{t: t, store: store, counts: &idempotency.Counters{}}
	e.idem, err = idempotency.New(idempotency.Config{
		Store: store, Namespace: "api", LeaseTTL: time.Minute, Observer: e.counts,
		Timing: idempotency.Timing{Poll: idempotency.Backoff{Initial: 5 * time.Millisecond}},
	})
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
	require.Equal(t, status, r.status, r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p struct {
		Type, Title, Detail string
		Status              int
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &p))
	require.Equal(t, status, p.Status)
	require.Equal(t, "about:blank", p.Type)
	require.Equal(t, http.StatusText(status), p.Title)
	require.NotEmpty(t, p.Detail)
}

func TestReplay(t *testing.T) {
	e := newEnv(t, httpidem.Config{Required: true}, created)
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

	// The same key on another route, or for another scope, is another key.
	other := e.post("/refunds", `"k-1"`, `{"amount":10}`)
	require.Equal(t, http.StatusCreated, other.status)
	require.Empty(t, other.header.Get(httpidem.ReplayedHeader))
	require.Equal(t, int32(2), e.runs.Load())

	rec, err := e.store.Inspect(t.Context(), "api:POST /orders||k-1")
	require.NoError(t, err)
	require.Equal(t, backends.StateCompleted, rec.State)
	require.Equal(t, `http="POST /orders"`, rec.Origin)
}

func TestScope(t *testing.T) {
	e := newEnv(t, httpidem.Config{Scope: func(r *http.Request) (string, error) {
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
}

func TestMissingAndInvalidKeys(t *testing.T) {
	required := newEnv(t, httpidem.Config{Required: true, MaxKeyBytes: 16}, created)
	requireProblem(t, required.post("/orders", "", `{}`), http.StatusBadRequest)
	for _, bad := range []string{`"unterminated`, `"a\b"`, `a b`, `""`, `"` + strings.Repeat("x", 17) + `"`, `"tab` + "\t" + `"`} {
		requireProblem(t, required.post("/orders", bad, `{}`), http.StatusBadRequest)
	}
	requireProblem(t, required.post("/orders", `"a"`, `{}`, httpidem.Header, `"b"`), http.StatusBadRequest)
	require.Zero(t, required.runs.Load())
	require.Equal(t, http.StatusCreated, required.post("/orders", `"with \"escapes\" \\"`, `{}`).status)

	optional := newEnv(t, httpidem.Config{}, created)
	for range 2 {
		r := optional.post("/orders", "", `{}`)
		require.Equal(t, http.StatusInternalServerError, r.status)
		require.Equal(t, "no lease\n", r.body, "without a key, a request passes through, unprotected")
	}
	require.Equal(t, int32(2), optional.runs.Load())
}

func TestFingerprintMismatch(t *testing.T) {
	e := newEnv(t, httpidem.Config{}, created)
	require.Equal(t, http.StatusCreated, e.post("/orders", `"k"`, `{"amount":10}`).status)
	requireProblem(t, e.post("/orders", `"k"`, `{"amount":99}`), http.StatusUnprocessableEntity)
	require.Equal(t, int32(1), e.runs.Load())
}

func TestStatusesStoredOrReleased(t *testing.T) {
	var status atomic.Int32
	e := newEnv(t, httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
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
}

func TestInProgress(t *testing.T) {
	for _, policy := range []httpidem.InProgressPolicy{httpidem.Conflict, httpidem.Wait} {
		t.Run(strconv.Itoa(int(policy)), func(t *testing.T) {
			started, finish := make(chan struct{}), make(chan struct{})
			var once sync.Once
			e := newEnv(t, httpidem.Config{InProgress: policy}, func(e *env, w http.ResponseWriter, r *http.Request) {
				once.Do(func() { close(started) })
				<-finish
				created(e, w, r)
			})
			firstDone := make(chan reply)
			go func() { firstDone <- e.post("/orders", `"k"`, `{}`) }()
			<-started
			if policy == httpidem.Conflict {
				r := e.post("/orders", `"k"`, `{}`)
				requireProblem(t, r, http.StatusConflict)
				secs, err := strconv.Atoi(r.header.Get("Retry-After"))
				require.NoError(t, err)
				require.GreaterOrEqual(t, secs, 1)
				require.LessOrEqual(t, secs, 60)
				require.Zero(t, e.counts.Waited(), "a conflict is answered at once, without waiting")
				close(finish)
				<-firstDone
				return
			}
			waited := make(chan reply)
			go func() { waited <- e.post("/orders", `"k"`, `{}`) }()
			// Whether it arrives before or after the completion, the
			// duplicate must get the original's response.
			time.Sleep(50 * time.Millisecond)
			close(finish)
			first, second := <-firstDone, <-waited
			require.Equal(t, first.body, second.body)
			require.Equal(t, "true", second.header.Get(httpidem.ReplayedHeader))
			require.Equal(t, int32(1), e.runs.Load())
		})
	}
}

func TestLimits(t *testing.T) {
	e := newEnv(t, httpidem.Config{MaxRequestBytes: 8, MaxResponseBytes: 64}, func(e *env, w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.WriteHeader(200)
		for range n {
			_, _ = w.Write([]byte("0123456789"))
		}
	})
	requireProblem(t, e.post("/orders", `"big"`, "123456789"), http.StatusRequestEntityTooLarge)
	require.Zero(t, e.runs.Load())

	// A response past the limit reaches the client whole, and is not
	// stored: the retry runs again.
	big := e.post("/orders?n=100", `"out"`, "")
	require.Equal(t, 200, big.status)
	require.Len(t, big.body, 1000)
	require.Len(t, e.post("/orders?n=100", `"out"`, "").body, 1000)
	require.Equal(t, int32(2), e.runs.Load())
	require.Equal(t, int64(2), e.counts.Count(idempotency.OutcomeHandlerFailed))
}

func TestPanicReleases(t *testing.T) {
	var panicked atomic.Bool
	e := newEnv(t, httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
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
}

func TestClientLeaves(t *testing.T) {
	// A handler that gives up with its client: the key is released.
	var finishes atomic.Bool
	entered := make(chan struct{}, 2)
	e := newEnv(t, httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
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

	// A handler that finishes its work anyway: the key is completed, and
	// the retry gets its response.
	finishes.Store(true)
	leave(`"finishes"`)
	require.Eventually(t, func() bool {
		rec, err := e.store.Inspect(t.Context(), "api:POST /orders||finishes")
		return err == nil && rec.State == backends.StateCompleted
	}, time.Minute, time.Millisecond)
	r := e.post("/orders", `"finishes"`, "")
	require.Equal(t, http.StatusCreated, r.status)
	require.Equal(t, "true", r.header.Get(httpidem.ReplayedHeader))
}

// TestCompletionOutputIsTheResponse: a handler that completes its own key
// (as contrib/sqloutbox's WithTx does, in its transaction) records the
// response written so far, and the retry replays it.
func TestCompletionOutputIsTheResponse(t *testing.T) {
	e := newEnv(t, httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
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
}

func TestInvalidConfig(t *testing.T) {
	_, err := httpidem.New(httpidem.Config{})
	require.ErrorIs(t, err, httpidem.ErrInvalidConfig)
	store, err := memstore.New(memstore.Options{})
	require.NoError(t, err)
	noNS, err := idempotency.New(idempotency.Config{Store: store})
	require.NoError(t, err)
	_, err = httpidem.New(httpidem.Config{Idempotency: noNS})
	require.ErrorContains(t, err, "Namespace")
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "api"})
	require.NoError(t, err)
	_, err = httpidem.New(httpidem.Config{Idempotency: idem, InProgress: 7, MaxKeyBytes: -1, MaxResponseBytes: 1 << 30})
	require.ErrorIs(t, err, httpidem.ErrInvalidConfig)
	for _, want := range []string{"InProgress", "MaxKeyBytes", "MaxResponseBytes"} {
		require.ErrorContains(t, err, want)
	}
}

// TestReset: a response written inside a transaction that then fails is
// discarded, and the error response released the key.
func TestReset(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	e := newEnv(t, httpidem.Config{}, func(e *env, w http.ResponseWriter, r *http.Request) {
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
}
