package main

import (
	"encoding/json"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
