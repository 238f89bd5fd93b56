package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/httpidem"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// idem inspect and idem list tell, on every store, which delivery holds
// a key or completed it (the origin the middleware gave its lease) and
// since when (the lease's acquisition, by the store's clock), in text and
// in JSON; a completed record's lease ends at its completion on every
// store.
func TestIdemShowsOriginAndAcquisition(t *testing.T) {
	for _, tg := range targets(t) {
		t.Run(tg.name, func(t *testing.T) {
			for _, kv := range tg.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			if tg.setup != nil {
				require.Contains(t, ok(t, tg.env, tg.setup...), "is ready")
			}
			testOriginShown(t, tg.env)
		})
	}
}

func testOriginShown(t *testing.T, env []string) {
	// A delivery in progress: its holder was killed, its lease lives on.
	holder, _ := startHolder(t, env, "origin-held")
	require.NoError(t, holder.Process.Signal(syscall.SIGKILL))
	_ = holder.Wait()
	v := inspectJSON(t, env, "charge:origin-held")
	require.Equal(t, "in_progress", v.State)
	require.Equal(t, "message_uuid=origin-held", v.Origin, "the middleware names the delivery")
	require.NotNil(t, v.AcquiredAt)
	require.WithinDuration(t, v.AcquiredAt.Add(leaseTTL), v.LeaseExpiresAt, time.Millisecond,
		"acquired one lease TTL before the lease ends")
	text := ok(t, env, "inspect", "charge:origin-held")
	require.Regexp(t, `(?m)^origin +message_uuid=origin-held$`, text)
	require.Regexp(t, `(?m)^acquired +at `+regexpStamp(*v.AcquiredAt)+`, [0-9hms.]+ ago$`, text)

	// A completed delivery: which message completed the key.
	var runs atomic.Int32
	_, err := deliver(t, "charge", "origin-done", &runs, nil, false)
	require.NoError(t, err)
	v = inspectJSON(t, env, "charge:origin-done")
	require.Equal(t, "completed", v.State)
	require.Equal(t, "message_uuid=origin-done", v.Origin)
	require.NotNil(t, v.AcquiredAt)
	require.NotNil(t, v.CompletedAt)
	require.True(t, v.LeaseExpiresAt.Equal(*v.CompletedAt), "lease_expires_at %v is completed_at %v", v.LeaseExpiresAt, *v.CompletedAt)
	require.False(t, v.CompletedAt.Before(*v.AcquiredAt))
	require.Regexp(t, `(?m)^origin +message_uuid=origin-done$`, ok(t, env, "inspect", "charge:origin-done"))

	// What a completed record stores, by what completed it.
	testOutputKinds(t, env)

	// A key an operator completed says so.
	ok(t, env, "complete", "charge:origin-op", "--create")
	require.Equal(t, "idem complete", inspectJSON(t, env, "charge:origin-op").Origin)

	// list shows them too.
	var page struct {
		Records []recordView `json:"records"`
	}
	require.NoError(t, json.Unmarshal([]byte(ok(t, env, "list", "--namespace", "charge", "-o", "json")), &page))
	origins := map[string]string{}
	for _, r := range page.Records {
		require.NotNil(t, r.AcquiredAt, "key %s", r.Key)
		origins[r.Key] = r.Origin
	}
	require.Equal(t, map[string]string{
		"charge:origin-held": "message_uuid=origin-held",
		"charge:origin-done": "message_uuid=origin-done",
		"charge:origin-op":   "idem complete",
	}, origins)
	text = ok(t, env, "list", "--namespace", "charge")
	require.Regexp(t, `(?m)^KEY +STATE +TOKEN +ATTEMPT +OWNER +ACQUIRED +LEASE LEFT +FORGOTTEN IN +ORIGIN$`, text)
	require.Regexp(t, `(?m)^"charge:origin-done" +completed .* [0-9hms.]+ ago .* message_uuid=origin-done$`, text)
}

// regexpStamp is t as idem prints it, quoted for a regular expression.
func regexpStamp(t time.Time) string { return strings.ReplaceAll(stamp(t), ".", `\.`) }

// testOutputKinds checks that inspect tells what a completed record
// stores by what completed it: an HTTP response through httpidem (its
// status), a function's result through Do (its size).
func testOutputKinds(t *testing.T, env []string) {
	ctx := context.Background()
	web, closeWeb, err := middlewareFor(ctx, "web", nil)
	require.NoError(t, err)
	defer closeWeb()
	mw, err := httpidem.New(httpidem.Config{Idempotency: web})
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created")
	}))
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"id":1}`))
	req.Header.Set("Idempotency-Key", "order-1")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	var page struct {
		Records []recordView `json:"records"`
	}
	require.NoError(t, json.Unmarshal([]byte(ok(t, env, "list", "--namespace", "web", "-o", "json")), &page))
	require.Len(t, page.Records, 1)
	key := page.Records[0].Key
	v := inspectJSON(t, env, key)
	require.Equal(t, outputHTTP, v.OutputKind, "origin %q", v.Origin)
	require.Equal(t, http.StatusCreated, v.HTTPStatus)
	require.Empty(t, v.OutputError)
	require.Empty(t, v.Output)
	require.Greater(t, v.OutputBytes, len("created"))
	require.Regexp(t, `(?m)^output +stored HTTP response: status 201, [0-9]+ bytes$`, ok(t, env, "inspect", key))

	calc, closeCalc, err := middlewareFor(ctx, "calc", nil)
	require.NoError(t, err)
	defer closeCalc()
	sum, err := idempotency.Do(ctx, calc, "sum-1", func(context.Context) (int, error) { return 42, nil })
	require.NoError(t, err)
	require.Equal(t, 42, sum)
	v = inspectJSON(t, env, "calc:sum-1")
	require.Equal(t, "do", v.Origin)
	require.Equal(t, outputResult, v.OutputKind)
	require.Equal(t, len("42"), v.OutputBytes)
	require.Empty(t, v.OutputError)
	require.Regexp(t, `(?m)^output +stored result: 2 bytes$`, ok(t, env, "inspect", "calc:sum-1"))
}
