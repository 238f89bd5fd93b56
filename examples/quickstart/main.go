// Command quickstart shows the idempotency middleware at work with no
// services: the in-memory store and Watermill's GoChannel.
//
// It publishes orders with the duplicates real brokers and producers make
// (a producer retry under a new message UUID, a message whose handler fails
// once, two copies of a slow order at once) and prints what happened to
// each delivery, then a summary: each line a sum that must add up, from
// what was published, what the middleware reported and what the handler
// charged. It exits non-zero if a sum or a claim is false.
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
	{"m08", "o-6", "o-6's charge takes 300ms", false},
	{"m09", "o-6", "a copy of o-6 published at once: the copy delivered first charges o-6, the other waits for it", true},
}

// Summary counts what happened: the messages published, every delivery
// the middleware reported, and the charges the handler made.
type Summary struct {
	// Published counts the messages published, Orders the orders among
	// them, and Repeats the messages for an order published before.
	Published, Orders, Repeats int
	// Deliveries counts the deliveries the middleware reported, Outcomes
	// them by outcome; Acked those acked, Nacked those nacked (GoChannel
	// delivers a nacked message again).
	Deliveries, Acked, Nacked int
	Outcomes                  map[idempotency.Outcome]int
	// DuplicatesAfterWaiting counts the duplicates that waited for the
	// copy in progress before they were dropped.
	DuplicatesAfterWaiting int
	// ChargesPerOrder is what the handler charged.
	ChargesPerOrder          map[string]int
	UnexpectedOutcomeByEvent []string
}

// sum is a line of the summary: a total and the parts it is made of.
type sum struct {
	label string
	total int
	of    string
	parts []part
}

type part struct {
	n  int
	of string
}

func (s sum) String() string {
	terms := make([]string, len(s.parts))
	for i, p := range s.parts {
		terms[i] = fmt.Sprintf("%d %s", p.n, p.of)
	}
	of := ""
	if s.of != "" {
		of = " " + s.of
	}
	return fmt.Sprintf("  %s: %d%s = %s", s.label, s.total, of, strings.Join(terms, " + "))
}

// check returns an error unless the parts add up to the total.
func (s sum) check() error {
	n := 0
	for _, p := range s.parts {
		n += p.n
	}
	if n != s.total {
		return fmt.Errorf("%s: %d, but its parts make %d", s.label, s.total, n)
	}
	return nil
}

// charges returns the charges made, the orders charged, and the charges
// of an order charged before.
func (s Summary) charges() (total, orders, again int) {
	for _, n := range s.ChargesPerOrder {
		total += n
		if n > 0 {
			orders++
			again += n - 1
		}
	}
	return total, orders, again
}

// sums are the lines of the summary.
func (s Summary) sums() []sum {
	total, orders, again := s.charges()
	o := s.Outcomes
	return []sum{
		{label: "messages published", total: s.Published, parts: []part{
			{s.Orders, "first messages of an order"}, {s.Repeats, "more for an order published before"}}},
		{label: "deliveries", total: s.Deliveries, parts: []part{
			{s.Published, "messages, each delivered once"}, {s.Nacked, "delivered again after a nack"}}},
		{label: "deliveries by outcome", total: s.Deliveries, parts: []part{
			{o[idempotency.OutcomeProcessed], "processed: the handler charged the order"},
			{o[idempotency.OutcomeDuplicate], fmt.Sprintf("dropped duplicates, the handler not run (%d after waiting for the copy in progress)", s.DuplicatesAfterWaiting)},
			{o[idempotency.OutcomeHandlerFailed], "failed: lease released, nacked"}}},
		{label: "charges", total: total, parts: []part{
			{orders, "orders charged"}, {again, "charges of an order charged before"}}},
	}
}

func (s Summary) check() error {
	var errs []error
	for _, line := range s.sums() {
		if err := line.check(); err != nil {
			errs = append(errs, err)
		}
	}
	_, orders, again := s.charges()
	if orders != s.Orders || again != 0 {
		errs = append(errs, fmt.Errorf("%d of %d orders charged, %d charges again", orders, s.Orders, again))
	}
	for order, n := range s.ChargesPerOrder {
		if n != 1 {
			errs = append(errs, fmt.Errorf("order %s charged %d times", order, n))
		}
	}
	if n := s.Outcomes[idempotency.OutcomeProcessed]; n != s.Orders {
		errs = append(errs, fmt.Errorf("%d deliveries processed for %d orders", n, s.Orders))
	}
	if s.Acked != s.Published {
		errs = append(errs, fmt.Errorf("%d deliveries acked for %d messages", s.Acked, s.Published))
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
		mu  sync.Mutex
		sum = Summary{Outcomes: map[idempotency.Outcome]int{}, ChargesPerOrder: map[string]int{}}
		// acked counts the acked deliveries: the publisher waits on it.
		acked atomic.Int32
		done  = make(chan struct{})
	)
	orderOf := map[string]string{}
	for _, d := range deliveries {
		orderOf[d.uuid] = d.order
	}
	observer := idempotency.ObserverFunc(func(_ context.Context, ev idempotency.Event) {
		mu.Lock()
		defer mu.Unlock()
		sum.Deliveries++
		sum.Outcomes[ev.Outcome]++
		order := orderOf[ev.MessageUUID]
		var what string
		switch ev.Outcome {
		case idempotency.OutcomeProcessed:
			what = fmt.Sprintf("processed (fencing token %d, attempt %d)", ev.Lease.Token, ev.Lease.Attempt)
			if ev.Lease.Attempt > 1 {
				what = fmt.Sprintf("delivered again and processed (attempt %d)", ev.Lease.Attempt)
			}
		case idempotency.OutcomeDuplicate:
			what = "dropped duplicate: already processed, handler not run"
			if ev.Waited > 0 {
				sum.DuplicatesAfterWaiting++
				what = fmt.Sprintf("waited %v for the copy in progress, then dropped duplicate", ev.Waited.Round(10*time.Millisecond))
			}
		case idempotency.OutcomeHandlerFailed:
			what = fmt.Sprintf("failed (%v): lease released, nacked for redelivery", ev.Err)
		default:
			sum.UnexpectedOutcomeByEvent = append(sum.UnexpectedOutcomeByEvent, fmt.Sprintf("%s for %s: %v", ev.Outcome, ev.MessageUUID, ev.Err))
			what = fmt.Sprintf("%s: %v", ev.Outcome, ev.Err)
		}
		fmt.Fprintf(w, "  %-4s %s  %s\n", order, ev.MessageUUID, what)
		if !ev.Acked() {
			sum.Nacked++
			return
		}
		sum.Acked++
		if acked.Add(1) == int32(len(deliveries)) {
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
		return Summary{}, err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return Summary{}, err
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
		sum.ChargesPerOrder[order]++
		mu.Unlock()
		return nil
	})

	go func() { _ = router.Run(ctx) }()
	defer router.Close()
	select {
	case <-router.Running():
	case <-ctx.Done():
		return Summary{}, ctx.Err()
	}

	fmt.Fprintln(w, "Publishing:")
	for _, d := range deliveries {
		note := ""
		if d.note != "" {
			note = "  (" + d.note + ")"
		}
		fmt.Fprintf(w, "  %-4s %s%s\n", d.order, d.uuid, note)
	}
	fmt.Fprintln(w, "\nWhat happened:")
	var published, orders, repeats int
	seen := map[string]bool{}
	for i, d := range deliveries {
		// Publish in order, each message once the one before it is settled,
		// unless it is meant to race the one before it.
		msg := message.NewMessage(d.uuid, []byte(fmt.Sprintf(`{"order_id":%q,"amount":"10.00"}`, d.order)))
		if err := pubSub.Publish("orders", msg); err != nil {
			return Summary{}, err
		}
		published++
		if seen[d.order] {
			repeats++
		} else {
			seen[d.order] = true
			orders++
		}
		if i+1 < len(deliveries) && !deliveries[i+1].concurrent {
			for acked.Load() < int32(i+1) {
				select {
				case <-ctx.Done():
					return Summary{}, fmt.Errorf("message %s was not settled: %w", d.uuid, ctx.Err())
				case <-time.After(time.Millisecond):
				}
			}
		}
	}

	select {
	case <-done:
	case <-ctx.Done():
		return Summary{}, fmt.Errorf("not every message was settled: %w", ctx.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	sum.Published, sum.Orders, sum.Repeats = published, orders, repeats
	keys := make([]string, 0, len(sum.ChargesPerOrder))
	for k, n := range sum.ChargesPerOrder {
		keys = append(keys, fmt.Sprintf("%s×%d", k, n))
	}
	sort.Strings(keys)
	fmt.Fprintf(w, "\nCharges per order: %s\n", strings.Join(keys, " "))
	fmt.Fprintln(w, "Summary:")
	for _, line := range sum.sums() {
		fmt.Fprintln(w, line)
	}
	verdict := sum.check()
	if verdict != nil {
		fmt.Fprintf(w, "Check FAILED: %v\n", verdict)
	} else {
		fmt.Fprintf(w, "Check: %d orders charged once each; %d messages published, each acked once, none lost.\n", sum.Orders, sum.Published)
	}
	return sum, verdict
}
