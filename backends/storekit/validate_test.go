package storekit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

func TestValidate(t *testing.T) {
	ok := backends.AcquireRequest{Key: "k", Owner: "o", LeaseTTL: time.Second, Retention: time.Hour, Fingerprint: []byte("f")}
	require.NoError(t, storekit.ValidateAcquire(ok))
	require.NoError(t, storekit.ValidateLease(backends.Lease{Key: "k", Owner: "o"}))
	for name, edit := range map[string]func(*backends.AcquireRequest){
		"empty key":        func(r *backends.AcquireRequest) { r.Key = "" },
		"long key":         func(r *backends.AcquireRequest) { r.Key = strings.Repeat("k", backends.MaxKeyBytes+1) },
		"empty owner":      func(r *backends.AcquireRequest) { r.Owner = "" },
		"long owner":       func(r *backends.AcquireRequest) { r.Owner = strings.Repeat("o", backends.MaxOwnerBytes+1) },
		"NUL in owner":     func(r *backends.AcquireRequest) { r.Owner = "o\x00" },
		"owner not UTF-8":  func(r *backends.AcquireRequest) { r.Owner = "\xff" },
		"no lease TTL":     func(r *backends.AcquireRequest) { r.LeaseTTL = 0 },
		"long lease TTL":   func(r *backends.AcquireRequest) { r.LeaseTTL = backends.MaxDuration + 1 },
		"negative ret.":    func(r *backends.AcquireRequest) { r.Retention = -1 },
		"long retention":   func(r *backends.AcquireRequest) { r.Retention = backends.MaxDuration + 1 },
		"long fingerprint": func(r *backends.AcquireRequest) { r.Fingerprint = make([]byte, backends.MaxFingerprintBytes+1) },
	} {
		req := ok
		edit(&req)
		require.ErrorIs(t, storekit.ValidateAcquire(req), backends.ErrInvalidRequest, name)
		if req.LeaseTTL == ok.LeaseTTL && req.Retention == ok.Retention && len(req.Fingerprint) == len(ok.Fingerprint) {
			require.ErrorIs(t, storekit.ValidateLease(backends.Lease{Key: req.Key, Owner: req.Owner}), backends.ErrInvalidRequest, name)
		}
	}
	require.NoError(t, storekit.ValidateKey(strings.Repeat("k", backends.MaxKeyBytes)))
	require.NoError(t, storekit.ValidateRetention(0))
	require.NoError(t, storekit.ValidateLeaseTTL(backends.MaxDuration))
}
