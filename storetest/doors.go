package storetest

import (
	"context"
	"errors"
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
	"github.com/watermill-idempotency/idempotency/httpidem"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// A door is a way into the middleware's engine other than a Watermill
// handler: [idempotency.Do], or an HTTP request through httpidem. The
// door tests run each door against the store under test.
type door struct {
	name string
	// call runs fn under key (in idem's namespace) through the door, with
	// fingerprint fp, and returns the result its caller got. A key in
	// progress is an error matching idempotency.ErrInProgress at once if
	// noWait, else after the door's wait; a failure of fn is an error
	// matching errDoorFailed; a fingerprint mismatch one matching
	// idempotency.ErrFingerprintMismatch.
	call func(ctx context.Context, idem *idempotency.Idempotency, key, fp string, noWait bool, fn func(ctx context.Context) (string, error)) (string, error)
}

// errDoorFailed is what a door's caller sees of a failure of fn.
var errDoorFailed = errors.New("storetest: the work failed")

var doors = []door{
	{name: "Do", call: func(ctx context.Context, idem *idempotency.Idempotency, key, fp string, noWait bool, fn func(ctx context.Context) (string, error)) (string, error) {
		v, err := idempotency.DoWith(ctx, idem, key, idempotency.DoOptions{Fingerprint: fp, NoWait: noWait}, fn)
		if errors.Is(err, errWork) {
			err = fmt.Errorf("%w: %w", errDoorFailed, err)
		}
		return v, err
	}},
	{name: "HTTP", call: httpCall},
}

// httpCall runs fn as the handler of a request through httpidem, with
// the key in its Idempotency-Key header and fp as its body (the default
// fingerprint covers the body).
func httpCall(ctx context.Context, idem *idempotency.Idempotency, key, fp string, noWait bool, fn func(ctx context.Context) (string, error)) (string, error) {
	policy := httpidem.Wait
	if noWait {
		policy = httpidem.Conflict
	}
	mw, err := httpidem.New(httpidem.Config{Idempotency: idem, Required: true, InProgress: policy})
	if err != nil {
		return "", err
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := fn(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, v)
	}))
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/door", strings.NewReader(fp))
	req.Header.Set(httpidem.Header, strconv.Quote(key))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	switch body := rec.Body.String(); rec.Code {
	case http.StatusOK:
		return body, nil
	case http.StatusConflict:
		return "", fmt.Errorf("%w: %s", idempotency.ErrInProgress, body)
	case http.StatusUnprocessableEntity:
		return "", fmt.Errorf("%w: %s", idempotency.ErrFingerprintMismatch, body)
	case http.StatusInternalServerError:
		return "", fmt.Errorf("%w: %s", errDoorFailed, body)
	default:
		return "", fmt.Errorf("storetest: status %d: %s", rec.Code, body)
	}
}

// errWork is the failure the door tests' work returns.
var errWork = errors.New("storetest: injected failure of the work")

var doorTests = []struct {
	name string
	fn   func(t *testing.T, s *suite, d door)
}{
	{"RunsOnceAndReplays", testDoorRunsOnceAndReplays},
	{"FailureReleases", testDoorFailureReleases},
	{"FingerprintMismatch", testDoorFingerprintMismatch},
	{"InProgress", testDoorInProgress},
	{"Storm", testDoorStorm},
}

// newDoorIdempotency returns the engine the door tests use: the store
// under test, the suite's namespace, a lease that outlasts every test.
func (s *suite) newDoorIdempotency(t *testing.T) *idempotency.Idempotency {
	idem, err := idempotency.New(idempotency.Config{
		Store:     s.Store,
		Namespace: s.prefix + "door",
		LeaseTTL:  long,
		Timing: idempotency.Timing{
			InProgressWait: long,
			Poll:           idempotency.Backoff{Initial: s.Tick / 10, Max: s.Tick},
		},
	})
	require.NoError(t, err)
	return idem
}

// doorKey is the key in the store of the door tests' key: an HTTP
// request's key is scoped by its route ("POST /door") and its scope
// (none).
func (s *suite) doorKey(d door, key string) string {
	if d.name == "HTTP" {
		return s.prefix + "door:POST /door||" + key
	}
	return s.prefix + "door:" + key
}

func testDoorRunsOnceAndReplays(t *testing.T, s *suite, d door) {
	idem := s.newDoorIdempotency(t)
	var runs atomic.Int32
	fn := func(ctx context.Context) (string, error) {
		l, ok := idempotency.LeaseFromContext(ctx)
		require.True(t, ok, "the work runs under a lease")
		return fmt.Sprintf("result-%d-%d", runs.Add(1), l.Token), nil
	}
	first, err := d.call(t.Context(), idem, "k", "", false, fn)
	require.NoError(t, err)
	second, err := d.call(t.Context(), idem, "k", "", false, fn)
	require.NoError(t, err)
	require.Equal(t, int32(1), runs.Load())
	require.Equal(t, first, second, "the duplicate gets the stored result")
	rec := s.inspect(t, s.doorKey(d, "k"))
	require.Equal(t, backends.StateCompleted, rec.State)
}

func testDoorFailureReleases(t *testing.T, s *suite, d door) {
	idem := s.newDoorIdempotency(t)
	_, err := d.call(t.Context(), idem, "k", "", false, func(context.Context) (string, error) { return "", errWork })
	require.ErrorIs(t, err, errDoorFailed)
	require.Equal(t, backends.StateReleased, s.inspect(t, s.doorKey(d, "k")).State)
	v, err := d.call(t.Context(), idem, "k", "", false, func(context.Context) (string, error) { return "second", nil })
	require.NoError(t, err)
	require.Equal(t, "second", v, "the released key runs again")
}

func testDoorFingerprintMismatch(t *testing.T, s *suite, d door) {
	idem := s.newDoorIdempotency(t)
	ok := func(context.Context) (string, error) { return "done", nil }
	_, err := d.call(t.Context(), idem, "k", "amount=10", false, ok)
	require.NoError(t, err)
	v, err := d.call(t.Context(), idem, "k", "amount=10", false, ok)
	require.NoError(t, err)
	require.Equal(t, "done", v)
	_, err = d.call(t.Context(), idem, "k", "amount=99", false, ok)
	require.ErrorIs(t, err, idempotency.ErrFingerprintMismatch)
}

func testDoorInProgress(t *testing.T, s *suite, d door) {
	idem := s.newDoorIdempotency(t)
	started, finish := make(chan struct{}), make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		_, err := d.call(context.Background(), idem, "k", "", false, func(context.Context) (string, error) {
			close(started)
			<-finish
			return "holder's", nil
		})
		holder <- err
	}()
	<-started
	never := func(context.Context) (string, error) { t.Error("a duplicate ran"); return "", nil }
	_, err := d.call(t.Context(), idem, "k", "", true, never)
	require.ErrorIs(t, err, idempotency.ErrInProgress, "never a success while the key is held")

	waited := make(chan string, 1)
	go func() {
		v, err := d.call(context.Background(), idem, "k", "", false, never)
		if err != nil {
			v = err.Error()
		}
		waited <- v
	}()
	time.Sleep(s.Tick)
	close(finish)
	require.NoError(t, <-holder)
	require.Equal(t, "holder's", <-waited, "a waiting duplicate gets the holder's result")
}

// testDoorStorm: many callers of a few keys at once, each key's effect
// written to a fenced sink: exactly one effect applied per key, and every
// caller gets the result of the one that applied it.
func testDoorStorm(t *testing.T, s *suite, d door) {
	const keys, callers = 3, 16
	idem := s.newDoorIdempotency(t)
	sink := NewSink()
	var wg sync.WaitGroup
	results := make([]chan string, keys)
	for k := range keys {
		results[k] = make(chan string, callers)
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := d.call(context.Background(), idem, fmt.Sprintf("k%d", k), "", false, func(ctx context.Context) (string, error) {
					l, _ := idempotency.LeaseFromContext(ctx)
					if err := sink.Apply(l); err != nil {
						return "", err
					}
					return fmt.Sprintf("applied-by-%d", l.Token), nil
				})
				if err != nil {
					v = err.Error()
				}
				results[k] <- v
			}()
		}
	}
	wg.Wait()
	tally, refused, err := sink.Tally()
	require.NoError(t, err)
	require.Zero(t, refused)
	require.Len(t, tally, keys)
	for key, tl := range tally {
		require.Equal(t, 1, tl.Applied, "key %s: effects applied", key)
	}
	for k := range keys {
		close(results[k])
		var first string
		for v := range results[k] {
			if first == "" {
				first = v
			}
			require.Equal(t, first, v, "key %d: every caller gets the one result", k)
		}
		require.Contains(t, first, "applied-by-")
	}
}
