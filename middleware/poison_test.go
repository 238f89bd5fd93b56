package middleware_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/keyfunc"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// poisonEnv is a router on GoChannel whose one handler runs behind a
// poison queue (outermost) and the middleware, and which records every
// delivery the router acks.
type poisonEnv struct {
	*routerEnv
	poisoned func() []*message.Message
	mu       sync.Mutex
	acked    []string // UUIDs
}

// newPoisonEnv uses PoisonQueueWithFilter with filter, or a plain
// PoisonQueue if filter is nil.
func newPoisonEnv(t *testing.T, m *middleware.Idempotency, filter func(error) bool, h message.HandlerFunc) *poisonEnv {
	e := &poisonEnv{}
	e.routerEnv = newRouter(t, func(r *message.Router, ps *gochannel.GoChannel) {
		var poison message.HandlerMiddleware
		var err error
		if filter != nil {
			poison, err = wmiddleware.PoisonQueueWithFilter(ps, "poison", filter)
		} else {
			poison, err = wmiddleware.PoisonQueue(ps, "poison")
		}
		require.NoError(t, err)
		record := func(next message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := next(msg)
				if err == nil {
					e.mu.Lock()
					e.acked = append(e.acked, msg.UUID)
					e.mu.Unlock()
				}
				return out, err
			}
		}
		r.AddHandler("h", "in", ps, "out", ps, h).AddMiddleware(record, poison, m.Middleware)
	})
	e.poisoned = e.collect(t, "poison")
	return e
}

func (e *poisonEnv) wasAcked(uuid string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Contains(e.acked, uuid)
}

func (e *poisonEnv) poisonedUUIDs() []string {
	var out []string
	for _, m := range e.poisoned() {
		out = append(out, m.UUID)
	}
	return out
}

func keyed(uuid, key, payload string) *message.Message {
	msg := newMsg(uuid, payload)
	msg.Metadata.Set("k", key)
	return msg
}

// Messages that can never succeed as sent go to the poison queue: no key,
// a payload that differs from the one its key was first seen with, an
// output too large to store.
func TestIsPoisonRoutesWhatCannotSucceed(t *testing.T) {
	m, counters := newMiddleware(t, newMemstore(), func(c *middleware.Config) {
		c.Key = keyfunc.Metadata("k")
		c.Fingerprint = keyfunc.PayloadHash()
		c.MaxOutputBytes = 100
	})
	e := newPoisonEnv(t, m, middleware.IsPoison, func(msg *message.Message) ([]*message.Message, error) {
		if string(msg.Payload) == "big" {
			return []*message.Message{newMsg("o", strings.Repeat("x", 200))}, nil
		}
		return nil, nil
	})
	e.publish(t, "in", keyed("first", "order-1", "amount=10"))
	waitFor(t, "first processed", func() bool { return counters.Count(middleware.OutcomeProcessed) == 1 })
	e.publish(t, "in", newMsg("no-key", "x"), keyed("other-payload", "order-1", "amount=99"), keyed("big-output", "order-2", "big"))
	waitFor(t, "three poisoned", func() bool { return len(e.poisoned()) == 3 })
	require.ElementsMatch(t, []string{"no-key", "other-payload", "big-output"}, e.poisonedUUIDs())
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeKeyError))
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeFingerprintMismatch))
	require.EqualValues(t, 1, counters.Count(middleware.OutcomeOutputTooLarge))
}

// What must come back is never poisoned, and never acked while it cannot
// be done: an in-flight duplicate, a store outage, a lost lease. Each is
// processed once its cause is gone. The control, a plain PoisonQueue,
// acks the in-flight duplicate into the poison queue: if the holder then
// failed, the message would be lost.
func TestIsPoisonNeverPoisonsWhatMustComeBack(t *testing.T) {
	t.Run("in-flight duplicate", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			filter  func(error) bool
			kept    bool
			outcome middleware.Outcome
		}{
			{"IsPoison", middleware.IsPoison, true, middleware.OutcomeDuplicate},
			{"control: plain PoisonQueue", nil, false, middleware.OutcomeInProgress},
		} {
			t.Run(tc.name, func(t *testing.T) {
				m, counters := newMiddleware(t, newMemstore(), func(c *middleware.Config) {
					c.Key = keyfunc.Metadata("k")
					c.Timing.InProgressWait = 20 * time.Millisecond
				})
				running, release := make(chan struct{}), make(chan struct{})
				e := newPoisonEnv(t, m, tc.filter, func(msg *message.Message) ([]*message.Message, error) {
					if msg.UUID == "holder" {
						close(running)
						<-release
					}
					return nil, nil
				})
				e.publish(t, "in", keyed("holder", "order-1", "x"))
				<-running
				e.publish(t, "in", keyed("duplicate", "order-1", "x"))
				if tc.kept {
					waitFor(t, "the duplicate nacked a few times", func() bool { return counters.Count(middleware.OutcomeInProgress) >= 3 })
					require.Empty(t, e.poisoned())
					require.False(t, e.wasAcked("duplicate"), "never acked while the holder runs")
				} else {
					// The poison queue publishes the message before it returns and
					// the router acks it: wait for both, while the holder still
					// runs.
					waitFor(t, "the duplicate poisoned and acked while its holder still runs", func() bool {
						return len(e.poisoned()) == 1 && e.wasAcked("duplicate")
					})
				}
				close(release)
				waitFor(t, "both settled", func() bool { return e.wasAcked("holder") && e.wasAcked("duplicate") })
				if tc.kept {
					require.EqualValues(t, 1, counters.Count(tc.outcome), "acked as a duplicate once the holder completed")
				}
			})
		}
	})

	t.Run("store outage", func(t *testing.T) {
		store := &faultStore{Store: newMemstore(), acquireErr: errors.New("connection refused")}
		m, counters := newMiddleware(t, store, func(c *middleware.Config) { c.Timing.StoreTimeout = 50 * time.Millisecond })
		e := newPoisonEnv(t, m, middleware.IsPoison, func(*message.Message) ([]*message.Message, error) { return nil, nil })
		e.publish(t, "in", newMsg("m1", "x"))
		waitFor(t, "store errors", func() bool { return counters.Count(middleware.OutcomeStoreError) >= 2 })
		require.Empty(t, e.poisoned())
		require.False(t, e.wasAcked("m1"))
		store.set(func(f *faultStore) { f.acquireErr = nil })
		waitFor(t, "processed once the store is back", func() bool { return counters.Count(middleware.OutcomeProcessed) == 1 })
		require.Empty(t, e.poisoned())
	})

	t.Run("lost lease", func(t *testing.T) {
		store := &faultStore{Store: newMemstore()}
		m, counters := newMiddleware(t, store, func(c *middleware.Config) { c.LeaseTTL = 300 * time.Millisecond })
		var attempts int
		e := newPoisonEnv(t, m, middleware.IsPoison, func(msg *message.Message) ([]*message.Message, error) {
			attempts++
			if attempts == 1 {
				store.set(func(f *faultStore) { f.renewErr = errors.New("connection refused") })
				<-msg.Context().Done()
				store.set(func(f *faultStore) { f.renewErr = nil })
				return nil, context.Cause(msg.Context())
			}
			return nil, nil
		})
		e.publish(t, "in", newMsg("m1", "x"))
		waitFor(t, "processed after the lost lease ran out", func() bool { return counters.Count(middleware.OutcomeProcessed) == 1 })
		require.EqualValues(t, 1, counters.Count(middleware.OutcomeLeaseLost))
		require.Empty(t, e.poisoned())
	})
}
