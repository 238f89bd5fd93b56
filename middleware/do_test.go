package middleware_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	"github.com/watermill-idempotency/idempotency/middleware"
	"github.com/watermill-idempotency/idempotency/storetest"
)

type receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func TestDoRunsOnceAndReplaysTheResult(t *testing.T) {
	store := newMemstore()
	idem, counters := newMiddleware(t, store, nil)
	var runs atomic.Int32
	charge := func(ctx context.Context) (receipt, error) {
		l, ok := middleware.LeaseFromContext(ctx)
		require.True(t, ok, "the function runs under a lease")
		require.Equal(t, "test:order-1", l.Key)
		out, err := middleware.CompletionOutput(ctx)
		require.NoError(t, err)
		require.Nil(t, out)
		return receipt{ID: "r-" + string(rune('0'+runs.Add(1))), Amount: 42}, nil
	}
	first, err := middleware.Do(t.Context(), idem, "order-1", charge)
	require.NoError(t, err)
	second, err := middleware.Do(t.Context(), idem, "order-1", charge)
	require.NoError(t, err)
	require.Equal(t, int32(1), runs.Load())
	require.Equal(t, receipt{ID: "r-1", Amount: 42}, first)
	require.Equal(t, first, second, "the duplicate gets the stored result")
	require.Equal(t, int64(1), counters.Count(middleware.OutcomeProcessed))
	require.Equal(t, int64(1), counters.Count(middleware.OutcomeDuplicate))

	rec, err := store.Inspect(t.Context(), "test:order-1")
	require.NoError(t, err)
	require.Equal(t, backends.StateCompleted, rec.State)
	require.Equal(t, "do", rec.Origin)
}

func TestDoReleasesOnFailure(t *testing.T) {
	idem, counters := newMiddleware(t, newMemstore(), nil)
	_, err := middleware.Do(t.Context(), idem, "k", func(context.Context) (int, error) { return 7, errBoom })
	require.ErrorIs(t, err, errBoom, "fn's own error comes back")
	v, err := middleware.Do(t.Context(), idem, "k", func(context.Context) (int, error) { return 8, nil })
	require.NoError(t, err)
	require.Equal(t, 8, v, "the released key runs again")

	_, err = middleware.Do(t.Context(), idem, "p", func(context.Context) (int, error) { return 0, middleware.Permanent(errBoom) })
	require.ErrorIs(t, err, middleware.ErrPermanent)
	require.Equal(t, int64(1), counters.Count(middleware.OutcomeHandlerFailed))
	require.Equal(t, int64(1), counters.Count(middleware.OutcomeHandlerFailedPermanently))

	// A result that cannot be encoded is a failure: the key is released.
	_, err = middleware.Do(t.Context(), idem, "enc", func(context.Context) (func(), error) { return func() {}, nil })
	require.ErrorContains(t, err, "encoding the result")
	v, err = middleware.Do(t.Context(), idem, "enc", func(context.Context) (int, error) { return 9, nil })
	require.NoError(t, err)
	require.Equal(t, 9, v)
}

func TestDoPanicReleasesTheKey(t *testing.T) {
	idem, _ := newMiddleware(t, newMemstore(), nil)
	require.PanicsWithValue(t, "kaboom", func() {
		_, _ = middleware.Do(t.Context(), idem, "k", func(context.Context) (int, error) { panic("kaboom") })
	})
	v, err := middleware.Do(t.Context(), idem, "k", func(context.Context) (int, error) { return 1, nil })
	require.NoError(t, err)
	require.Equal(t, 1, v)
}

func TestDoRefusesBadInput(t *testing.T) {
	noNS, _ := newMiddleware(t, newMemstore(), func(c *middleware.Config) { c.Namespace = "" })
	fn := func(context.Context) (int, error) { t.Error("fn ran"); return 0, nil }
	_, err := middleware.Do(t.Context(), noNS, "k", fn)
	require.ErrorIs(t, err, middleware.ErrNoNamespace)
	var ke *middleware.KeyError
	require.ErrorAs(t, err, &ke)

	idem, _ := newMiddleware(t, newMemstore(), nil)
	_, err = middleware.Do(t.Context(), idem, "", fn)
	require.ErrorIs(t, err, middleware.ErrInvalidKey)
	_, err = middleware.Do(t.Context(), idem, strings.Repeat("x", 600), fn)
	require.ErrorIs(t, err, middleware.ErrKeyTooLong)
	_, err = middleware.Do(t.Context(), (*middleware.Idempotency)(nil), "k", fn)
	require.ErrorIs(t, err, middleware.ErrInvalidConfig)
	_, err = middleware.Do[int](t.Context(), idem, "k", nil)
	require.ErrorIs(t, err, middleware.ErrInvalidConfig)
	_, err = middleware.CompletionOutput(t.Context())
	require.ErrorIs(t, err, middleware.ErrNoLease)
}

func TestDoFingerprintMismatchIsAlwaysAnError(t *testing.T) {
	// OnFingerprintMismatch is for messages: a call never ignores one.
	idem, _ := newMiddleware(t, newMemstore(), func(c *middleware.Config) { c.OnFingerprintMismatch = middleware.MismatchIgnore })
	ok := func(context.Context) (int, error) { return 1, nil }
	_, err := middleware.DoWith(t.Context(), idem, "k", middleware.DoOptions{Fingerprint: "amount=10"}, ok)
	require.NoError(t, err)
	v, err := middleware.DoWith(t.Context(), idem, "k", middleware.DoOptions{Fingerprint: "amount=10"}, ok)
	require.NoError(t, err)
	require.Equal(t, 1, v)
	_, err = middleware.DoWith(t.Context(), idem, "k", middleware.DoOptions{Fingerprint: "amount=99"}, ok)
	require.ErrorIs(t, err, middleware.ErrFingerprintMismatch)
}

func TestDoReplayOfAnotherTypeIsAStoreError(t *testing.T) {
	idem, _ := newMiddleware(t, newMemstore(), nil)
	_, err := middleware.Do(t.Context(), idem, "k", func(context.Context) (string, error) { return "text", nil })
	require.NoError(t, err)
	_, err = middleware.Do(t.Context(), idem, "k", func(context.Context) (int, error) { return 1, nil })
	require.ErrorIs(t, err, middleware.ErrStore)
	require.ErrorContains(t, err, "as int")
}

func TestDoInProgress(t *testing.T) {
	idem, counters := newMiddleware(t, newMemstore(), func(c *middleware.Config) { c.LeaseTTL = time.Minute })
	started, finish := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := middleware.Do(context.Background(), idem, "k", func(context.Context) (int, error) {
			close(started)
			<-finish
			return 5, nil
		})
		require.NoError(t, err)
	}()
	<-started
	fn := func(context.Context) (int, error) { t.Error("a duplicate ran"); return 0, nil }

	// NoWait: refused at once, with the holder's remaining lease.
	_, err := middleware.DoWith(t.Context(), idem, "k", middleware.DoOptions{NoWait: true}, fn)
	var ip *middleware.InProgressError
	require.ErrorAs(t, err, &ip)
	require.Greater(t, ip.Remaining, time.Duration(0))

	// A caller that gives up while waiting.
	ctx, cancel := context.WithCancel(t.Context())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	_, err = middleware.Do(ctx, idem, "k", fn)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, int64(1), counters.Count(middleware.OutcomeCanceled))

	// A waiting duplicate gets the holder's result when it completes.
	got := make(chan int)
	go func() {
		v, err := middleware.Do(context.Background(), idem, "k", fn)
		require.NoError(t, err)
		got <- v
	}()
	waitFor(t, "the duplicate to wait", func() bool { return counters.Waited() > 0 || len(got) > 0 })
	close(finish)
	require.Equal(t, 5, <-got)
	wg.Wait()
}

// TestDoStorm: 50 callers of one key, each key's effect fenced: exactly
// one applied effect per key, and every caller gets its result.
func TestDoStorm(t *testing.T) {
	store := newMemstore()
	idem, _ := newMiddleware(t, store, func(c *middleware.Config) { c.Timing.InProgressWait = time.Minute })
	sink := storetest.NewSink()
	const keys, callers = 5, 50
	var wg sync.WaitGroup
	results := make([][]string, keys)
	var mu sync.Mutex
	for k := range keys {
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := "order-" + string(rune('a'+k))
				v, err := middleware.Do(context.Background(), idem, key, func(ctx context.Context) (string, error) {
					l, _ := middleware.LeaseFromContext(ctx)
					if err := sink.Apply(l); err != nil {
						return "", err
					}
					return key + "-done", nil
				})
				require.NoError(t, err)
				mu.Lock()
				results[k] = append(results[k], v)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	tally, refused, err := sink.Tally()
	require.NoError(t, err)
	require.Len(t, tally, keys)
	for key, tl := range tally {
		require.Equal(t, 1, tl.Applied, "key %s", key)
	}
	require.Zero(t, refused)
	for k := range keys {
		require.Len(t, results[k], callers)
		for _, v := range results[k] {
			require.Equal(t, "order-"+string(rune('a'+k))+"-done", v)
		}
	}
}

// A fingerprint mismatch is the caller's own input when it comes through
// Do (or an HTTP request): Do returns it, so it is logged at debug level,
// as a duplicate is. A broker's message with one is logged at error level.
func TestDoFingerprintMismatchIsNotLoggedAsAnError(t *testing.T) {
	logger := watermill.NewCaptureLogger()
	idem, counters := newMiddleware(t, newMemstore(), func(c *middleware.Config) { c.Logger = logger })
	ok := func(context.Context) (int, error) { return 1, nil }
	_, err := middleware.DoWith(t.Context(), idem, "k", middleware.DoOptions{Fingerprint: "amount=10"}, ok)
	require.NoError(t, err)
	_, err = middleware.DoWith(t.Context(), idem, "k", middleware.DoOptions{Fingerprint: "amount=99"}, ok)
	require.ErrorIs(t, err, middleware.ErrFingerprintMismatch)
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeFingerprintMismatch))
	require.Empty(t, logger.Captured()[watermill.ErrorLogLevel])
	var debug bool
	for _, msg := range logger.Captured()[watermill.DebugLogLevel] {
		if msg.Msg == "idempotency: fingerprint_mismatch" && msg.Fields["idempotency_key"] == "test:k" {
			debug = true
			require.ErrorIs(t, msg.Fields["err"].(error), middleware.ErrFingerprintMismatch)
		}
	}
	require.True(t, debug, "logged at debug with its error: %v", logger.Captured())

	msgs, _ := newMiddleware(t, newMemstore(), func(c *middleware.Config) {
		c.Logger, c.Fingerprint = logger, keyfunc.PayloadHash()
	})
	h := msgs.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	_, err = h(newMsg("m", "amount=10"))
	require.NoError(t, err)
	_, err = h(newMsg("m", "amount=99"))
	require.ErrorIs(t, err, middleware.ErrFingerprintMismatch)
	require.Len(t, logger.Captured()[watermill.ErrorLogLevel], 1, "a message's mismatch is logged at error level")
}
