// Command quickstart shows the idempotency middleware at work with no
// services: the in-memory store and Watermill's GoChannel.
//
// It publishes orders with the duplicates real brokers and producers make
// (a producer retry under a new message UUID, a message whose handler fails
// once, a concurrent duplicate of a slow message) and prints what happened
// to each delivery, then a summary that must match what was sent.
//
//	go run ./quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum, err := run(ctx, os.Stdout)
	if err == nil {
		err = sum.check()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// delivery is one message the demo publishes.
type delivery struct {
	uuid, order string
	note        string
	// concurrent publishes this message without waiting for the one
	// before it to be settled.
	concurrent bool
}

// The story: every order must be charged exactly once.
var deliveries = []delivery{
	{"m01", "o-1", "", false},
	{"m02", "o-2", "", false},
	{"m03", "o-3", "", false},
	{"m04", "o-2", "producer retry of o-2 under a new message UUID", false},
	{"m05", "o-4", "", false},
	{"m06", "o-3", "producer retry of o-3", false},
	{"m07", "o-5", "the payment gateway times out on the first attempt", false},
	{"m08", "o-6", "slow: the handler takes 300ms", false},
	{"m09", "o-6", "concurrent duplicate of the slow o-6", true},
}

// Summary counts what happened.
type Summary struct {
	Sent, Orders             int
	Charged                  int // handler side effects
	Processed, Duplicates    int
	DuplicatesAfterWaiting   int
	FailedAttempts, Retried  int
	ChargesPerOrder          map[string]int
	UnexpectedOutcomeByEvent []string
}

func (s Summary) check() error {
	var errs []error
	if s.Charged != s.Orders {
		errs = append(errs, fmt.Errorf("charged %d times for %d orders", s.Charged, s.Orders))
	}
	for order, n := range s.ChargesPerOrder {
		if n != 1 {
			errs = append(errs, fmt.Errorf("order %s charged %d times", order, n))
		}
	}
	if s.Processed+s.Duplicates != s.Sent {
		errs = append(errs, fmt.Errorf("%d processed + %d duplicates != %d sent", s.Processed, s.Duplicates, s.Sent))
	}
	for _, u := range s.UnexpectedOutcomeByEvent {
		errs = append(errs, errors.New("unexpected outcome: "+u))
	}
	return errors.Join(errs...)
}

func run(ctx context.Context, w io.Writer) (Summary, error) {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, logger)
	defer pubSub.Close()

	var (
		mu      sync.Mutex
		sum     = Summary{Sent: len(deliveries), ChargesPerOrder: map[string]int{}}
		settled atomic.Int32
		done    = make(chan struct{})
	)
	orderOf := map[string]string{}
	for _, d := range deliveries {
		orderOf[d.uuid] = d.order
	}
	observer := idempotency.ObserverFunc(func(_ context.Context, ev idempotency.Event) {
		mu.Lock()
		defer mu.Unlock()
		order := orderOf[ev.MessageUUID]
		var what string
		switch ev.Outcome {
		case idempotency.OutcomeProcessed:
			sum.Processed++
			what = fmt.Sprintf("processed (fencing token %d, attempt %d)", ev.Lease.Token, ev.Lease.Attempt)
			if ev.Lease.Attempt > 1 {
				sum.Retried++
				what = fmt.Sprintf("retried and processed (attempt %d)", ev.Lease.Attempt)
			}
		case idempotency.OutcomeDuplicate:
			sum.Duplicates++
			what = "dropped duplicate: already processed, handler not run"
			if ev.Waited > 0 {
				sum.DuplicatesAfterWaiting++
				what = fmt.Sprintf("waited %v for the copy in progress, then dropped duplicate", ev.Waited.Round(10*time.Millisecond))
			}
		case idempotency.OutcomeHandlerFailed:
			sum.FailedAttempts++
			what = fmt.Sprintf("failed (%v): lease released, nacked for redelivery", ev.Err)
		default:
			sum.UnexpectedOutcomeByEvent = append(sum.UnexpectedOutcomeByEvent, fmt.Sprintf("%s for %s: %v", ev.Outcome, ev.MessageUUID, ev.Err))
			what = fmt.Sprintf("%s: %v", ev.Outcome, ev.Err)
		}
		fmt.Fprintf(w, "  %-4s %s  %s\n", order, ev.MessageUUID, what)
		if ev.Outcome.Acked() && settled.Add(1) == int32(len(deliveries)) {
			close(done)
		}
	})

	store, err := memstore.New(memstore.Options{})
	if err != nil {
		return Summary{}, err
	}
	idem, err := idempotency.New(idempotency.Config{
		Store:    store,
		Key:      keyfunc.JSONField("order_id"),
		LeaseTTL: 2 * time.Second,
		Observer: observer,
	})
	if err != nil {
		return sum, err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return sum, err
	}
	router.AddMiddleware(idem.Middleware)

	var gatewayCalls atomic.Int32
	router.AddConsumerHandler("charge-order", "orders", pubSub, func(msg *message.Message) error {
		order := orderOf[msg.UUID]
		switch order {
		case "o-5":
			if gatewayCalls.Add(1) == 1 {
				return errors.New("payment gateway timeout")
			}
		case "o-6":
			time.Sleep(300 * time.Millisecond)
		}
		mu.Lock()
		sum.Charged++
		sum.ChargesPerOrder[order]++
		mu.Unlock()
		return nil
	})

	go func() { _ = router.Run(ctx) }()
	defer router.Close()
	select {
	case <-router.Running():
	case <-ctx.Done():
		return sum, ctx.Err()
	}

	orders := map[string]bool{}
	fmt.Fprintln(w, "Publishing:")
	for _, d := range deliveries {
		orders[d.order] = true
		note := ""
		if d.note != "" {
			note = "  (" + d.note + ")"
		}
		fmt.Fprintf(w, "  %-4s %s%s\n", d.order, d.uuid, note)
	}
	sum.Orders = len(orders)
	fmt.Fprintln(w, "\nWhat happened:")
	for i, d := range deliveries {
		// Publish in order, each message once the one before it is settled,
		// unless it is meant to race the one before it.
		msg := message.NewMessage(d.uuid, []byte(fmt.Sprintf(`{"order_id":%q,"amount":"10.00"}`, d.order)))
		if err := pubSub.Publish("orders", msg); err != nil {
			return sum, err
		}
		if i+1 < len(deliveries) && !deliveries[i+1].concurrent {
			for settled.Load() < int32(i+1) {
				select {
				case <-ctx.Done():
					return sum, fmt.Errorf("message %s was not settled: %w", d.uuid, ctx.Err())
				case <-time.After(time.Millisecond):
				}
			}
		}
	}

	select {
	case <-done:
	case <-ctx.Done():
		return sum, fmt.Errorf("not every message was settled: %w", ctx.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	keys := make([]string, 0, len(sum.ChargesPerOrder))
	for k, n := range sum.ChargesPerOrder {
		keys = append(keys, fmt.Sprintf("%s×%d", k, n))
	}
	sort.Strings(keys)
	fmt.Fprintf(w, "\nCharges per order: %s\n", strings.Join(keys, " "))
	fmt.Fprintf(w, "Summary: %d messages for %d orders: %d processed (%d after a retry), %d dropped duplicates (%d after waiting), %d failed attempt retried.\n",
		sum.Sent, sum.Orders, sum.Processed, sum.Retried, sum.Duplicates, sum.DuplicatesAfterWaiting, sum.FailedAttempts)
	verdict := sum.check()
	if verdict != nil {
		fmt.Fprintf(w, "Check FAILED: %v\n", verdict)
	} else {
		fmt.Fprintf(w, "Check: %d orders charged once each, %d messages settled, none lost.\n", sum.Orders, sum.Sent)
	}
	return sum, verdict
}
