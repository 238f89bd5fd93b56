package middleware_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"github.com/ThreeDotsLabs/watermill"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// These tests call the wrapped handler directly, as the router would, to
// look at exactly what it returns: a nil error means the router acks.

func ok(*message.Message) ([]*message.Message, error) { return nil, nil }

// Many goroutines deliver the same key at once while the body runs. No
// call may return success before the body has finished.
func TestConcurrentDeliveriesNeverAckedWhileRunning(t *testing.T) {
	const n = 50
	store := &countingStore{Store: newMemstore()}
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.Timing.InProgressWait = time.Minute // no duplicate gives up before the body ends, however slow the machine
	})
	var runs atomic.Int32
	var bodyDone atomic.Bool
	release := make(chan struct{})
	h := m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		<-release
		bodyDone.Store(true)
		return nil, nil
	})

	var wg sync.WaitGroup
	var ackedEarly, acked atomic.Int32
	for range n {
		wg.Go(func() {
			_, err := h(newMsg("k", "x"))
			if err == nil {
				acked.Add(1)
				if !bodyDone.Load() {
					ackedEarly.Add(1)
				}
			}
		})
	}
	waitFor(t, "body running", func() bool { return runs.Load() == 1 })
	// A duplicate watches the key once it found it in progress: all of
	// them wait for the body when it finishes.
	waitFor(t, "the others waiting", func() bool { return store.watches.Load() == n-1 })
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()

	require.EqualValues(t, 1, runs.Load())
	require.Zero(t, ackedEarly.Load(), "a duplicate was acked while the body ran")
	require.EqualValues(t, n, acked.Load(), "every delivery acked after completion")
	require.EqualValues(t, n-1, counters.Count(middleware.OutcomeDuplicate))
	require.EqualValues(t, n-1, counters.Waited(), "every duplicate waited for the body")
}

func TestInProgressAfterWaitIsNacked(t *testing.T) {
	m, counters := newMiddleware(t, newMemstore(), func(c *middleware.Config) {
		c.Timing.InProgressWait = 30 * time.Millisecond
	})
	release := make(chan struct{})
	var runs atomic.Int32
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) { runs.Add(1); <-release; return nil, nil })
	holderDone := make(chan error)
	go func() { _, err := h(newMsg("k", "x")); holderDone <- err }()
	waitFor(t, "holder running", func() bool { return runs.Load() == 1 })
	_, err := h(newMsg("k", "x"))
	var ipe *middleware.InProgressError
	require.ErrorAs(t, err, &ipe)
	require.ErrorIs(t, err, middleware.ErrInProgress)
	require.Equal(t, "test:k", ipe.Key)
	require.Positive(t, ipe.Remaining)
	require.GreaterOrEqual(t, ipe.Waited, 30*time.Millisecond)
	require.Positive(t, counters.Count(middleware.OutcomeInProgress))
	close(release)
	require.NoError(t, <-holderDone)
}

func TestNegativeWaitNacksAtOnce(t *testing.T) {
	store := &faultStore{Store: newMemstore()}
	m, _ := newMiddleware(t, store, func(c *middleware.Config) { c.Timing.InProgressWait = -1 })
	_, err := store.Store.Acquire(context.Background(), backends.AcquireRequest{Key: "test:k", Owner: "other", LeaseTTL: time.Minute, Retention: time.Minute})
	require.NoError(t, err)
	before := store.acquires.Load()
	_, err = m.Middleware(ok)(newMsg("k", "x"))
	require.ErrorIs(t, err, middleware.ErrInProgress)
	require.EqualValues(t, 1, store.acquires.Load()-before, "one look, no polling")
}

// A holder that crashed stops renewing; a duplicate waits for its lease to
// run out and takes over.
func TestTakeoverOfCrashedHolder(t *testing.T) {
	store := newMemstore()
	m, counters := newMiddleware(t, store, nil)
	crashed, err := store.Acquire(context.Background(), backends.AcquireRequest{Key: "test:k", Owner: "crashed", LeaseTTL: 100 * time.Millisecond, Retention: time.Minute})
	require.NoError(t, err)

	var got backends.Lease
	_, err = m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		got, _ = middleware.LeaseFromContext(msg.Context())
		return nil, nil
	})(newMsg("k", "x"))
	require.NoError(t, err)
	require.True(t, got.Takeover)
	require.Greater(t, got.Token, crashed.Lease.Token)
	require.Equal(t, 2, got.Attempt)
	require.EqualValues(t, 1, counters.Takeovers())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessed))
}

// A holder that fails releases the key; a duplicate waiting for it takes
// the key at once and processes it.
func TestWaitingDuplicateProcessesAfterHolderFails(t *testing.T) {
	store := &countingStore{Store: newMemstore()}
	m, counters := newMiddleware(t, store, nil)
	release := make(chan struct{})
	var runs atomic.Int32
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) {
		if runs.Add(1) == 1 {
			<-release
			return nil, errBoom
		}
		return nil, nil
	})
	first := make(chan error)
	go func() { _, err := h(newMsg("k", "x")); first <- err }()
	waitFor(t, "holder running", func() bool { return runs.Load() == 1 })
	second := make(chan error)
	go func() { _, err := h(newMsg("k", "x")); second <- err }()
	waitFor(t, "the duplicate waiting", func() bool { return store.watches.Load() == 1 })
	close(release)
	require.ErrorIs(t, <-first, errBoom)
	require.NoError(t, <-second)
	require.EqualValues(t, 2, runs.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessed))
	require.EqualValues(t, 1, counters.Waited())
}

func TestPanicReleasesAndRepanics(t *testing.T) {
	store := newMemstore()
	m, counters := newMiddleware(t, store, nil)
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) { panic("handler bug") })
	func() {
		defer func() { require.Equal(t, "handler bug", recover(), "the original panic goes on") }()
		_, _ = h(newMsg("k", "x"))
	}()
	rec, err := store.Inspect(context.Background(), "test:k")
	require.NoError(t, err)
	require.Equal(t, backends.StateReleased, rec.State)
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeHandlerFailed))
}

func TestHandlerErrorReleasesAndIsReturned(t *testing.T) {
	store := newMemstore()
	m, _ := newMiddleware(t, store, nil)
	_, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, errBoom })(newMsg("k", "x"))
	require.ErrorIs(t, err, errBoom)
	rec, err := store.Inspect(context.Background(), "test:k")
	require.NoError(t, err)
	require.Equal(t, backends.StateReleased, rec.State)
}

func TestLeaseIsInTheHandlerContext(t *testing.T) {
	m, _ := newMiddleware(t, newMemstore(), nil)
	msg := newMsg("k", "x")
	orig := msg.Context()
	var lease backends.Lease
	var ok bool
	_, err := m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		lease, ok = middleware.LeaseFromContext(msg.Context())
		return nil, nil
	})(msg)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "test:k", lease.Key)
	require.Positive(t, lease.Token)
	require.Equal(t, 1, lease.Attempt)
	require.Equal(t, orig, msg.Context(), "the message's context is restored after the handler")
	_, ok = middleware.LeaseFromContext(context.Background())
	require.False(t, ok)
}

// An operator deletes the key while the handler runs (or another worker
// takes it over): the next renewal finds the lease lost, the handler's
// context is cancelled with ErrLeaseLost, and the message is nacked.
func TestLeaseLostCancelsHandlerAndNacks(t *testing.T) {
	store := newMemstore()
	m, counters := newMiddleware(t, store, func(c *middleware.Config) { c.LeaseTTL = 60 * time.Millisecond })
	var cause error
	out, err := m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		require.NoError(t, store.Delete(context.Background(), "test:k"))
		<-msg.Context().Done()
		cause = context.Cause(msg.Context())
		return []*message.Message{newMsg("out", "x")}, nil // even a success is not acked
	})(newMsg("k", "x"))
	require.ErrorIs(t, cause, backends.ErrLeaseLost)
	require.ErrorIs(t, err, backends.ErrLeaseLost)
	require.Nil(t, out, "no output is published for a lost lease")
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeLeaseLost))
}

// The store becomes unreachable while the handler runs: renewals hang and
// fail. The handler's context is cancelled while the lease is still live
// on the store, so no other worker can have taken over yet.
func TestStoreUnreachableMidHandlerCancelsBeforeExpiry(t *testing.T) {
	inner := newMemstore()
	store := &faultStore{Store: inner}
	m, counters := newMiddleware(t, store, func(c *middleware.Config) { c.LeaseTTL = time.Second }) // a 100ms margin
	var stateAtCancel backends.State
	_, err := m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		store.set(func(f *faultStore) { f.renewErr = errors.New("connection refused") })
		<-msg.Context().Done()
		rec, err := inner.Inspect(context.Background(), "test:k")
		require.NoError(t, err)
		stateAtCancel = rec.State
		return nil, msg.Context().Err()
	})(newMsg("k", "x"))
	require.ErrorIs(t, err, backends.ErrLeaseLost)
	require.Equal(t, backends.StateInProgress, stateAtCancel, "cancelled before the lease expired on the store")
	require.Positive(t, store.renews.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeLeaseLost))
}

// Renewals keep a long handler's lease: a duplicate arriving after several
// TTLs still finds it in progress.
func TestRenewalKeepsLongHandlerLease(t *testing.T) {
	store := &faultStore{Store: newMemstore()}
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.LeaseTTL = 300 * time.Millisecond // renewed every 100ms, with a 30ms margin
		c.Timing.InProgressWait = -1
	})
	release := make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { <-release; return nil, nil })(newMsg("k", "x"))
		done <- err
	}()
	waitFor(t, "several renewals", func() bool { return store.renews.Load() >= 5 })
	_, err := m.Middleware(ok)(newMsg("k", "x"))
	require.ErrorIs(t, err, middleware.ErrInProgress, "the renewed lease still holds after five renewals")
	close(release)
	require.NoError(t, <-done)
	require.EqualValues(t, 0, counters.Takeovers())
}

func TestStoreDownFailsClosed(t *testing.T) {
	store := &faultStore{Store: newMemstore(), acquireErr: errors.New("connection refused")}
	m, counters := newMiddleware(t, store, func(c *middleware.Config) { c.Timing.StoreTimeout = 50 * time.Millisecond })
	var runs atomic.Int32
	_, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil })(newMsg("k", "x"))
	require.ErrorIs(t, err, middleware.ErrStore)
	require.Zero(t, runs.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeStoreError))
	require.Greater(t, store.acquires.Load(), int64(1), "retried within StoreTimeout")
}

func TestStoreDownRunUnprotected(t *testing.T) {
	store := &faultStore{Store: newMemstore(), acquireErr: errors.New("connection refused")}
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.Timing.StoreTimeout = 50 * time.Millisecond
		c.OnStoreError = middleware.StoreErrorRunUnprotected
	})
	var runs atomic.Int32
	_, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil })(newMsg("k", "x"))
	require.NoError(t, err)
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeUnprotected))
}

// The store applied the Acquire but the reply was lost; the retry with the
// same owner gets the lease back rather than finding it in progress.
func TestAmbiguousAcquireRetriedReentrantly(t *testing.T) {
	store := &faultStore{Store: newMemstore(), ambiguous: 1}
	m, counters := newMiddleware(t, store, nil)
	var lease backends.Lease
	_, err := m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		lease, _ = middleware.LeaseFromContext(msg.Context())
		return nil, nil
	})(newMsg("k", "x"))
	require.NoError(t, err)
	require.EqualValues(t, 1, lease.Token, "the lease it got back, not a new one")
	require.Equal(t, 1, lease.Attempt)
	require.EqualValues(t, 2, store.acquires.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessed))
}

func TestKeyErrors(t *testing.T) {
	var runs atomic.Int32
	run := func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil }
	tests := []struct {
		name string
		cfg  func(c *middleware.Config)
		msg  *message.Message
		want error
	}{
		{"missing metadata", func(c *middleware.Config) { c.Key = keyfunc.Metadata("Idempotency-Key") }, newMsg("u", ""), keyfunc.ErrNoKey},
		{"malformed json", func(c *middleware.Config) { c.Key = keyfunc.JSONField("id") }, newMsg("u", "{"), keyfunc.ErrMalformedPayload},
		{"empty uuid", nil, newMsg("", "x"), keyfunc.ErrNoKey},
		{"too long", nil, newMsg(strings.Repeat("x", 600), "x"), middleware.ErrKeyTooLong},
		{"too long with namespace", func(c *middleware.Config) { c.MaxKeyBytes = 10 }, newMsg("123456", "x"), middleware.ErrKeyTooLong},
		{"no namespace outside a router", func(c *middleware.Config) { c.Namespace = "" }, newMsg("u", "x"), middleware.ErrNoNamespace},
		{"custom extractor returns empty", func(c *middleware.Config) {
			c.Key = keyfunc.Func(func(*message.Message) (string, error) { return "", nil })
		}, newMsg("u", "x"), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, counters := newMiddleware(t, newMemstore(), tc.cfg)
			_, err := m.Middleware(run)(tc.msg)
			var ke *middleware.KeyError
			require.ErrorAs(t, err, &ke)
			require.Equal(t, tc.msg.UUID, ke.MessageUUID)
			require.ErrorIs(t, err, middleware.ErrInvalidKey)
			require.True(t, middleware.IsPoison(err))
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
			}
			require.EqualValues(t, 1, counters.Count(middleware.OutcomeKeyError))
		})
	}
	require.Zero(t, runs.Load(), "the handler never ran for a message without a key")
}

func TestKeyErrorRunUnprotectedPolicy(t *testing.T) {
	m, counters := newMiddleware(t, newMemstore(), func(c *middleware.Config) {
		c.Key = keyfunc.Metadata("k")
		c.OnKeyError = middleware.KeyErrorRunUnprotected
	})
	var runs atomic.Int32
	_, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil })(newMsg("u", "x"))
	require.NoError(t, err)
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeUnprotected))
}

func TestFingerprintMismatch(t *testing.T) {
	store := newMemstore()
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.Key = keyfunc.Metadata("k")
		c.Fingerprint = keyfunc.PayloadHash()
	})
	withKey := func(payload string) *message.Message {
		msg := newMsg("u-"+payload, payload)
		msg.Metadata.Set("k", "order-1")
		return msg
	}
	var runs atomic.Int32
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil })
	_, err := h(withKey("amount=10"))
	require.NoError(t, err)
	_, err = h(withKey("amount=10"))
	require.NoError(t, err, "same payload: a duplicate")
	_, err = h(withKey("amount=99"))
	require.ErrorIs(t, err, middleware.ErrFingerprintMismatch)
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeFingerprintMismatch))

	// While in progress, a mismatch is rejected without waiting, and a
	// mismatching delivery that acquires a released key releases it again.
	release := make(chan struct{})
	hold := m.Middleware(func(*message.Message) ([]*message.Message, error) { <-release; return nil, errBoom })
	msg := newMsg("u", "a")
	msg.Metadata.Set("k", "order-2")
	held := make(chan error)
	go func() { _, err := hold(msg); held <- err }()
	waitFor(t, "order-2 held", func() bool {
		rec, err := store.Inspect(context.Background(), "test:order-2")
		return err == nil && rec.State == backends.StateInProgress
	})
	other := newMsg("u2", "b")
	other.Metadata.Set("k", "order-2")
	_, err = h(other)
	require.ErrorIs(t, err, middleware.ErrFingerprintMismatch)
	close(release)
	require.ErrorIs(t, <-held, errBoom)
	_, err = h(other)
	require.ErrorIs(t, err, middleware.ErrFingerprintMismatch)
	rec, err := store.Inspect(context.Background(), "test:order-2")
	require.NoError(t, err)
	require.Equal(t, backends.StateReleased, rec.State, "the mismatching delivery gave the key back")
}

// A message whose fingerprint cannot be extracted (keyfunc.PayloadHash of
// an empty payload) is handled without one: its record keeps none, and a
// later message under its key is not compared with it.
func TestFingerprintNotExtractedIsNotCompared(t *testing.T) {
	store := newMemstore()
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.Key = keyfunc.Metadata("k")
		c.Fingerprint = keyfunc.PayloadHash()
	})
	deliver := func(payload string) error {
		msg := newMsg("u-"+payload, payload)
		msg.Metadata.Set("k", "order-1")
		_, err := m.Middleware(ok)(msg)
		return err
	}
	require.NoError(t, deliver(""))
	rec, err := store.Inspect(context.Background(), "test:order-1")
	require.NoError(t, err)
	require.Nil(t, rec.Fingerprint)
	require.NoError(t, deliver("x"), "not compared: a duplicate")
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeProcessed))
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeDuplicate))
}

// A fingerprint extractor may return anything, the payload itself
// included: one over backends.MaxFingerprintBytes is stored as its SHA-256,
// so a 70 KiB message is processed once, its duplicate dropped and another
// payload under its key refused, on every store alike.
func TestLongFingerprintIsHashed(t *testing.T) {
	store := newMemstore()
	m, counters := newMiddleware(t, store, func(c *middleware.Config) {
		c.Key = keyfunc.Metadata("k")
		c.Fingerprint = keyfunc.Func(func(msg *message.Message) (string, error) { return string(msg.Payload), nil })
	})
	withKey := func(fill byte) *message.Message {
		msg := newMsg(watermill.NewUUID(), string(bytes.Repeat([]byte{fill}, 70<<10)))
		msg.Metadata.Set("k", "order-1")
		return msg
	}
	var runs atomic.Int32
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil })
	_, err := h(withKey('a'))
	require.NoError(t, err, "the first delivery of a long payload")
	_, err = h(withKey('a'))
	require.NoError(t, err, "its duplicate")
	_, err = h(withKey('b'))
	require.ErrorIs(t, err, middleware.ErrFingerprintMismatch)
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeDuplicate))
	rec, err := store.Inspect(context.Background(), "test:order-1")
	require.NoError(t, err)
	sum := sha256.Sum256(bytes.Repeat([]byte{'a'}, 70<<10))
	require.Equal(t, sum[:], rec.Fingerprint)
}

func TestFingerprintMismatchIgnorePolicy(t *testing.T) {
	var events []middleware.Event
	var mu sync.Mutex
	m, _ := newMiddleware(t, newMemstore(), func(c *middleware.Config) {
		c.Key = keyfunc.Metadata("k")
		c.Fingerprint = keyfunc.PayloadHash()
		c.OnFingerprintMismatch = middleware.MismatchIgnore
		c.Observer = middleware.ObserverFunc(func(_ context.Context, ev middleware.Event) {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		})
	})
	for _, p := range []string{"a", "b"} {
		msg := newMsg("u-"+p, p)
		msg.Metadata.Set("k", "same")
		_, err := m.Middleware(ok)(msg)
		require.NoError(t, err)
	}
	require.Len(t, events, 2)
	require.Equal(t, middleware.OutcomeDuplicate, events[1].Outcome)
	require.True(t, events[1].FingerprintMismatch)
}

func TestOutputTooLargeReleases(t *testing.T) {
	store := newMemstore()
	m, counters := newMiddleware(t, store, func(c *middleware.Config) { c.MaxOutputBytes = 100 })
	_, err := m.Middleware(func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{newMsg("o", strings.Repeat("x", 200))}, nil
	})(newMsg("k", "x"))
	require.ErrorIs(t, err, middleware.ErrOutputTooLarge)
	rec, err := store.Inspect(context.Background(), "test:k")
	require.NoError(t, err)
	require.Equal(t, backends.StateReleased, rec.State)
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeOutputTooLarge))
}

// limitedStore is a store with a limit of its own on a completion's
// output, as DynamoDB's item size sets one.
type limitedStore struct {
	*memstore.Store
	limit int
}

func (s limitedStore) MaxOutputBytes() int { return s.limit }

// A store's output limit lowers the default MaxOutputBytes, so that an
// output the store cannot hold is the middleware's typed error, and a
// configuration above it is refused.
func TestStoreOutputLimit(t *testing.T) {
	store := limitedStore{newMemstore(), 300}
	m, counters := newMiddleware(t, store, nil)
	produce := func(n int) message.HandlerFunc {
		return func(*message.Message) ([]*message.Message, error) {
			return []*message.Message{newMsg("o", strings.Repeat("x", n))}, nil
		}
	}
	_, err := m.Middleware(produce(100))(newMsg("fits", "x"))
	require.NoError(t, err)
	_, err = m.Middleware(produce(400))(newMsg("over", "x"))
	require.ErrorIs(t, err, middleware.ErrOutputTooLarge)
	require.ErrorContains(t, err, "the limit is 300")
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeOutputTooLarge))

	_, err = middleware.New(middleware.Config{Store: store, MaxOutputBytes: 301})
	require.ErrorIs(t, err, middleware.ErrInvalidConfig)
	require.ErrorContains(t, err, "store's limit 300")
	_, err = middleware.New(middleware.Config{Store: store, MaxOutputBytes: 200})
	require.NoError(t, err, "a lower limit than the store's is the user's choice")
	_, err = middleware.New(middleware.Config{Store: limitedStore{newMemstore(), 0}})
	require.NoError(t, err, "0: the store sets no limit")
}

func TestCorruptStoredOutputIsAnError(t *testing.T) {
	store := newMemstore()
	res, err := store.Acquire(context.Background(), backends.AcquireRequest{Key: "test:k", Owner: "o", LeaseTTL: time.Minute, Retention: time.Minute})
	require.NoError(t, err)
	require.NoError(t, store.Complete(context.Background(), res.Lease, []byte{9, 9, 9}))
	m, _ := newMiddleware(t, store, nil)
	_, err = m.Middleware(ok)(newMsg("k", "x"))
	require.ErrorIs(t, err, backends.ErrCorruptOutput)
}

func TestMessageContextCancelledWhileWaiting(t *testing.T) {
	store := newMemstore()
	_, err := store.Acquire(context.Background(), backends.AcquireRequest{Key: "test:k", Owner: "other", LeaseTTL: time.Minute, Retention: time.Minute})
	require.NoError(t, err)
	m, counters := newMiddleware(t, store, nil)
	msg := newMsg("k", "x")
	ctx, cancel := context.WithCancel(context.Background())
	msg.SetContext(ctx)
	time.AfterFunc(30*time.Millisecond, cancel)
	_, err = m.Middleware(ok)(msg)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, middleware.ErrInProgress)
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeCanceled), "cancelled, not a store error")
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	store := newMemstore()
	tests := map[string]middleware.Config{
		"no store":              {},
		"bad extractor":         {Store: store, Key: keyfunc.JSONField()},
		"bad fingerprint":       {Store: store, Fingerprint: keyfunc.JSONField()},
		"negative lease":        {Store: store, LeaseTTL: -time.Second},
		"lease too short":       {Store: store, LeaseTTL: time.Millisecond},
		"negative retention":    {Store: store, Retention: -time.Hour},
		"retention of 24 ns":    {Store: store, Retention: 24},
		"retention below lease": {Store: store, LeaseTTL: time.Minute, Retention: time.Minute - time.Millisecond},
		"negative poll":         {Store: store, Timing: middleware.Timing{Poll: middleware.Backoff{Initial: -1}}},
		"max poll below poll":   {Store: store, Timing: middleware.Timing{Poll: middleware.Backoff{Initial: time.Second, Max: time.Millisecond}}},
		"negative timeout":      {Store: store, Timing: middleware.Timing{StoreTimeout: -1}},
		"negative max key":      {Store: store, MaxKeyBytes: -1},
		"namespace fills key":   {Store: store, Namespace: "abcdef", MaxKeyBytes: 7},
		"negative max output":   {Store: store, MaxOutputBytes: -1},
		"unknown key policy":    {Store: store, OnKeyError: 7},
		"unknown mismatch pol.": {Store: store, OnFingerprintMismatch: 7},
		"unknown store policy":  {Store: store, OnStoreError: 7},
		"typed-nil store":       {Store: (*memstore.Store)(nil)},
		"lease near overflow":   {Store: store, LeaseTTL: math.MaxInt64},
		"retention over max":    {Store: store, Retention: backends.MaxDuration + 1},
		"wait over max":         {Store: store, Timing: middleware.Timing{InProgressWait: math.MaxInt64}},
		"timeout over max":      {Store: store, Timing: middleware.Timing{StoreTimeout: math.MaxInt64}},
		"key over store limit":  {Store: store, MaxKeyBytes: backends.MaxKeyBytes + 1},
		"negative acquires":     {Store: store, MaxConcurrentAcquires: -1},
		"negative backoff":      {Store: store, Timing: middleware.Timing{StoreBackoff: middleware.Backoff{Max: -1}}},
		"negative poison pause": {Store: store, Timing: middleware.Timing{PoisonBackoff: middleware.Backoff{Initial: -1}}},
		"negative watched poll": {Store: store, Timing: middleware.Timing{WatchedPoll: -1}},
	}
	for name, cfg := range tests {
		m, err := middleware.New(cfg)
		require.ErrorIs(t, err, middleware.ErrInvalidConfig, name)
		require.Nil(t, m, name)
	}
	_, err := middleware.New(middleware.Config{Store: (*memstore.Store)(nil)})
	require.ErrorContains(t, err, "Store is a nil *memstore.Store")
	_, err = middleware.New(middleware.Config{Store: store, Retention: math.MaxInt64})
	require.ErrorContains(t, err, "Retention must be at most 876000h0m0s")
	_, err = middleware.New(middleware.Config{Store: store, Retention: 24})
	require.ErrorContains(t, err, "Retention (24ns) must be at least LeaseTTL (30s)")
	_, err = middleware.New(middleware.Config{Store: store, LeaseTTL: time.Minute, Retention: time.Minute})
	require.NoError(t, err, "a retention as long as the lease")

	// The largest values allowed work.
	_, err = middleware.New(middleware.Config{Store: store, LeaseTTL: backends.MaxDuration, Retention: backends.MaxDuration,
		MaxKeyBytes: backends.MaxKeyBytes})
	require.NoError(t, err)

	_, err = middleware.New(middleware.Config{LeaseTTL: -1, Retention: -1})
	require.ErrorContains(t, err, "Store is required")
	require.ErrorContains(t, err, "LeaseTTL")
	require.ErrorContains(t, err, "Retention", "every invalid field is listed")
}

func TestNewDoesNotModifyCallersConfig(t *testing.T) {
	cfg := middleware.Config{Store: newMemstore()}
	before := cfg
	_, err := middleware.New(cfg)
	require.NoError(t, err)
	require.Equal(t, before, cfg)
}

// The handler completes the key itself (as pgstore's CompleteTx does in the
// handler's transaction); a renewal afterwards finds the key completed and
// reports the lease lost. The delivery is still processed and acked: the
// key was completed under this very lease.
func TestHandlerCompletedKeyIsNotALostLease(t *testing.T) {
	store := newMemstore()
	var events []middleware.Event
	m, _ := newMiddleware(t, store, func(c *middleware.Config) {
		c.LeaseTTL = 30 * time.Millisecond
		c.Observer = middleware.ObserverFunc(func(_ context.Context, ev middleware.Event) { events = append(events, ev) })
	})
	out, err := m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		lease, _ := middleware.LeaseFromContext(msg.Context())
		require.NoError(t, store.Complete(context.Background(), lease, nil))
		<-msg.Context().Done() // the next renewal finds the key completed
		require.ErrorIs(t, context.Cause(msg.Context()), backends.ErrLeaseLost)
		return []*message.Message{newMsg("out", "x")}, nil
	})(newMsg("k", "x"))
	require.NoError(t, err, "acked")
	require.Len(t, out, 1, "and its output published")
	require.Len(t, events, 1)
	require.Equal(t, middleware.OutcomeProcessed, events[0].Outcome)
	require.True(t, events[0].CompletedByHandler)
}

// callCounting is memstore counting the calls that settle a key.
type callCounting struct {
	*memstore.Store
	completes, inspects atomic.Int64
}

func (s *callCounting) Complete(ctx context.Context, lease backends.Lease, output []byte) error {
	s.completes.Add(1)
	return s.Store.Complete(ctx, lease, output)
}

func (s *callCounting) Inspect(ctx context.Context, key string) (backends.Record, error) {
	s.inspects.Add(1)
	return s.Store.Inspect(ctx, key)
}

// Work that completed its key in a transaction that committed, and says
// so (MarkCompletedInTx, as contrib/sqloutbox's WithTx does), costs the
// door no store call after it:
// without the mark, the door's Complete fails and an Inspect confirms
// the key completed by this lease.
func TestWorkMarkedCompletedSettlesWithoutTheStore(t *testing.T) {
	for _, mark := range []bool{true, false} {
		t.Run(fmt.Sprintf("marked=%v", mark), func(t *testing.T) {
			store := &callCounting{Store: newMemstore()}
			var events []middleware.Event
			m, _ := newMiddleware(t, store, func(c *middleware.Config) {
				c.Observer = middleware.ObserverFunc(func(_ context.Context, ev middleware.Event) { events = append(events, ev) })
			})
			_, err := m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				lease, _ := middleware.LeaseFromContext(msg.Context())
				require.NoError(t, store.Store.Complete(context.Background(), lease, nil)) // its transaction's
				if mark {
					require.True(t, middleware.MarkCompletedInTx(msg.Context()))
				}
				return nil, nil
			})(newMsg("k", "x"))
			require.NoError(t, err)
			require.False(t, middleware.MarkCompletedInTx(context.Background()), "no lease, no mark")
			require.Len(t, events, 1)
			require.Equal(t, middleware.OutcomeProcessed, events[0].Outcome)
			require.True(t, events[0].CompletedByHandler)
			calls := store.completes.Load() + store.inspects.Load()
			if mark {
				require.Zero(t, calls, "store calls after the work")
			} else {
				require.Equal(t, int64(2), calls, "the door's Complete and Inspect")
			}
			rec, err := store.Inspect(context.Background(), "test:k")
			require.NoError(t, err)
			require.Equal(t, backends.StateCompleted, rec.State)
		})
	}
}
