package middleware_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/keyfunc"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// countingLogger counts the error lines of each message.
type countingLogger struct {
	watermill.NopLogger
	mu     sync.Mutex
	errors map[string]int
	fields []watermill.LogFields
}

func (l *countingLogger) Error(msg string, _ error, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.errors == nil {
		l.errors = map[string]int{}
	}
	l.errors[msg]++
	l.fields = append(l.fields, fields)
}

func (l *countingLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l *countingLogger) count(prefix string) (n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for msg, c := range l.errors {
		if strings.HasPrefix(msg, prefix) {
			n += c
		}
	}
	return n
}

// The README's router, as it is, on GoChannel, which redelivers a nacked
// message at once, meets a message without a key: it fails the same way
// every time. Its first failure is nacked at once; each repeat pauses
// longer, up to Timing.PoisonBackoff.Max (2 s), so in 4 s it is delivered a
// handful of times, not the hundred thousand times of a nack loop, and
// the middleware logs it at most once a second, with the count of the
// lines it left out.
func TestPermanentFailureDoesNotSpin(t *testing.T) {
	const watch = 4 * time.Second
	logger := &countingLogger{}
	counters := &middleware.Counters{}
	idem, err := middleware.New(middleware.Config{
		Store:    newMemstore(),
		Key:      keyfunc.JSONField("order_id"),
		Logger:   logger,
		Observer: counters,
	})
	require.NoError(t, err)

	ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	require.NoError(t, err)
	router.AddMiddleware(idem.Middleware)
	var ran int
	router.AddConsumerHandler("charge-order", "orders", ps, func(*message.Message) error { ran++; return nil })
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	t.Cleanup(func() { _ = router.Close(); _ = ps.Close() })

	require.NoError(t, ps.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(`{"no_order_id":1}`))))
	time.Sleep(watch)
	deliveries := counters.Count(middleware.OutcomeKeyError)
	logged := logger.count("idempotency: ")
	t.Logf("in %v: %d deliveries of a message without a key, %d error lines from the middleware, %d from the router",
		watch, deliveries, logged, logger.count("Handler returned error"))
	require.Zero(t, ran)
	require.GreaterOrEqual(t, deliveries, int64(3), "it still comes back")
	// 0, then 100, 200, 400, 800, 1600 ms (±20 %): about 6 in 4 s.
	require.LessOrEqual(t, deliveries, int64(8), "paced, not spinning")
	require.LessOrEqual(t, logged, 5, "at most one line a second")
	require.LessOrEqual(t, logger.count("Handler returned error"), int(deliveries))
	var suppressed bool
	logger.mu.Lock()
	for _, f := range logger.fields {
		if _, ok := f["suppressed_since_last"]; ok {
			suppressed = true
		}
	}
	logger.mu.Unlock()
	require.True(t, suppressed, "a line after left-out ones counts them")
}

// A first failure is nacked at once, so a poison queue takes each of many
// messages without a key without delay; only a message that comes back is
// paced.
func TestFirstPermanentFailureIsNotPaced(t *testing.T) {
	m, counters := newMiddleware(t, newMemstore(), func(c *middleware.Config) {
		c.Key = keyfunc.Metadata("k")
		c.Timing.PoisonBackoff = middleware.Backoff{Initial: time.Hour} // a repeat would pause for ever
	})
	e := newPoisonEnv(t, m, middleware.IsPoison, func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for i := range 50 {
		e.publish(t, "in", newMsg("no-key-"+strings.Repeat("x", i), "x"))
	}
	waitFor(t, "all fifty poisoned", func() bool { return len(e.poisoned()) == 50 })
	require.EqualValues(t, 50, counters.Count(middleware.OutcomeKeyError))
}

// infoLogger records the info lines.
type infoLogger struct {
	watermill.NopLogger
	mu    sync.Mutex
	lines []watermill.LogFields
}

func (l *infoLogger) Info(msg string, fields watermill.LogFields) {
	if !strings.HasPrefix(msg, "idempotency: ") {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fields)
}

func (l *infoLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// Two handlers of one topic under the default namespace (their names): the
// middleware cannot tell different consumers from copies of one, so it
// says so, once per pair; with Config.Namespace set it says nothing.
func TestSharedTopicUnderDefaultNamespaceIsReported(t *testing.T) {
	for _, tc := range []struct {
		namespace string
		want      int
	}{{"", 1}, {"orders", 0}} {
		logger := &infoLogger{}
		counters := &middleware.Counters{}
		idem, err := middleware.New(middleware.Config{Store: newMemstore(), Namespace: tc.namespace, Logger: logger, Observer: counters})
		require.NoError(t, err)
		ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		router.AddMiddleware(idem.Middleware)
		for _, name := range []string{"orders-0", "orders-1"} {
			router.AddConsumerHandler(name, "orders", ps, func(*message.Message) error { return nil })
		}
		go func() { _ = router.Run(context.Background()) }()
		<-router.Running()
		for range 5 {
			require.NoError(t, ps.Publish("orders", message.NewMessage(watermill.NewUUID(), nil)))
		}
		// GoChannel gives every handler every message; with one namespace
		// the second handler's copy of each is a duplicate.
		waitFor(t, "ten deliveries", func() bool { return total(counters) == 10 })
		require.NoError(t, router.Close())
		require.NoError(t, ps.Close())
		logger.mu.Lock()
		require.Len(t, logger.lines, tc.want, "namespace %q", tc.namespace)
		if tc.want == 1 {
			require.Equal(t, "orders", logger.lines[0]["topic"])
			require.ElementsMatch(t, []any{"orders-0", "orders-1"}, []any{logger.lines[0]["handler"], logger.lines[0]["other_handler"]})
		}
		logger.mu.Unlock()
	}
}

// A burst of failures and then silence: the first line is logged at once,
// the rest are left out, and when the second ends the last of them is
// logged with the count of the others, though no other failure follows.
// Every delivery is accounted for: the lines plus their counts.
func TestSuppressedLinesAreReportedWhenTheSecondEnds(t *testing.T) {
	const burst = 7
	logger := &countingLogger{}
	m, _ := newMiddleware(t, newMemstore(), func(c *middleware.Config) {
		c.Key = keyfunc.Metadata("k")
		c.Logger = logger
	})
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	start := time.Now()
	for i := range burst {
		_, err := h(newMsg(fmt.Sprintf("no-key-%d", i), "x"))
		require.ErrorIs(t, err, middleware.ErrInvalidKey)
	}
	last := time.Now()
	require.Equal(t, 1, logger.count("idempotency: key_error"), "one line at once")
	waitFor(t, "the left-out lines reported", func() bool { return logger.count("idempotency: key_error") == 2 })
	t.Logf("the burst took %v; its count was logged %v after its last failure, %v after its first line",
		last.Sub(start), time.Since(last), time.Since(start))

	logger.mu.Lock()
	defer logger.mu.Unlock()
	require.Len(t, logger.fields, 2)
	require.Equal(t, "no-key-0", logger.fields[0]["message_uuid"])
	require.NotContains(t, logger.fields[0], "suppressed_since_last")
	require.Equal(t, fmt.Sprintf("no-key-%d", burst-1), logger.fields[1]["message_uuid"], "the last one left out")
	require.Equal(t, burst-2, logger.fields[1]["suppressed_since_last"], "and the others counted")
}
