// Package story is the order-processing story every broker's end-to-end
// test tells, written once: two consumers of one service charge orders
// through the idempotency middleware into a fenced sink, while the
// producer retries (the same order under new message UUIDs), one order
// fails once, one is slow enough that its duplicates arrive while it
// runs, and one is held by a consumer that crashes. Each broker plugs in
// with a [Broker]: its publisher, its subscribers and what it does on its
// own.
package story

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
	"github.com/watermill-idempotency/idempotency/storetest"
)

// Broker is a pub/sub the story runs on.
type Broker struct {
	// Name names the broker in the report.
	Name string
	// Publisher publishes the orders to Topic.
	Publisher message.Publisher
	// Subscriber returns one consumer's subscriber. Every consumer's
	// subscriber is in one consumer group (or on one queue): each message
	// goes to one of them.
	Subscriber func(consumer string) (message.Subscriber, error)
	// Topic is where the orders go.
	Topic string
	// Middleware, if any, runs outside the idempotency middleware (a
	// broker's helper that delays an in-flight duplicate's redelivery).
	Middleware []message.HandlerMiddleware
	// Configure adjusts the middleware's configuration for the broker:
	// its LeaseTTL and Timing.InProgressWait (brokers.md). Timing.InProgressWait
	// defaults to a quarter of SlowFor here, so that a duplicate of the
	// slow order gives up waiting and is nacked while it runs, and the
	// poison queue meets an in-flight duplicate on every broker.
	Configure func(c *idempotency.Config)
	// SlowCopies is how many copies of the slow order the producer sends
	// at once. Defaults to 2. A broker whose consumer handles one message
	// at a time, and cannot handle a redelivery while it nacks a copy in a
	// loop (Redis Streams), sends 1, so that the broker's own redelivery
	// finds a consumer free while the order runs.
	SlowCopies int
	// SlowFor is how long the slow order's handler runs. Defaults to 2s.
	SlowFor time.Duration
	// RedeliversWhileRunning is set for a broker that delivers the slow
	// order's message again on its own while its first delivery still
	// runs (an ack deadline, AckWait, a visibility timeout).
	RedeliversWhileRunning bool
	// Redeliver, if set, is called once the slow order's first delivery
	// runs, with the consumer running it, and makes the broker deliver
	// that message again by its own means while the handler goes on: a
	// connection dropped under it (the broker requeues what it held
	// unacked), a consumer evicted from its group. The check then asks
	// for such a redelivery, as it does with RedeliversWhileRunning.
	Redeliver func(consumer string)
	// Serialized is set for a broker that never hands out a message while
	// another delivery of the topic is being handled (it locks the topic):
	// no duplicate can arrive while the slow order runs, and the check
	// does not ask for one.
	Serialized bool
	// DeliveriesPerMessage is how many deliveries each published message
	// gets when all is well: 1, or one per consumer group when each
	// consumer has its own group. Defaults to 1.
	DeliveriesPerMessage int

	// Crash, if set, cuts a consumer's connections to the broker the way
	// the death of its process would, before its router is closed. Needed
	// where closing a subscriber is a graceful shutdown that changes what
	// the broker does with the message it held (NATS drains).
	Crash func(consumer string)

	// Observer, if set, is told about every delivery too (metrics).
	Observer idempotency.Observer
	// SetupRouter, if set, is called with each consumer's router before
	// its handler is added (router metrics).
	SetupRouter func(r *message.Router)
}

// The orders with a story.
const (
	SlowOrder   = "order-slow"   // its duplicates arrive while it runs
	FlakyOrder  = "order-flaky"  // the payment gateway fails its first attempt
	OutageOrder = "order-outage" // the lease store refuses its first acquisitions
	CrashOrder  = "order-crash"  // its first holder crashes while it runs
	namespace   = "charge"

	// AttemptMetadata numbers the producer's copies of an order from 0.
	AttemptMetadata = "producer_attempt"
)

// Report is what happened.
type Report struct {
	Broker    string
	Published int
	// Orders is how many distinct orders were published.
	Orders int
	// Applied counts, per order, the charges the fenced sink applied.
	Applied map[string]int
	// StaleRefused counts charges the sink refused from a holder whose
	// lease had been taken over.
	StaleRefused int64
	// Outcomes counts deliveries by outcome.
	Outcomes map[string]int64
	// SlowDeliveries counts deliveries of the slow order's messages, and
	// SlowInFlight those that arrived while it ran: they waited for its
	// holder, or were nacked still in progress. SlowRedelivered counts
	// deliveries of a slow-order message (by UUID) that began while an
	// earlier delivery of the same message was still being handled: the
	// broker's own redelivery of a message in progress, not a producer's
	// copy.
	SlowDeliveries, SlowInFlight, SlowRedelivered int64
	// AckedEarly lists duplicates acked while their order was not yet
	// charged: an in-flight duplicate acked. Must be empty.
	AckedEarly []string
	// Poisoned counts messages the poison queue took (the consumers run
	// Watermill's PoisonQueueWithFilter with idempotency.IsPoison
	// outermost): in-flight duplicates and store errors must never go
	// there. Must be zero.
	Poisoned int64
	// StoreCallsWhileSlow counts every store call made while the slow
	// order ran, over SlowRun: what its waiting duplicates cost.
	StoreCallsWhileSlow int64
	SlowRun             time.Duration
	// CrashedConsumer is the consumer that crashed holding the crash
	// order: its store calls stopped and its router closed while the
	// handler ran. CrashTakeover is set if the order was then charged
	// under a lease that took the dead holder's over, CrashRecovery
	// after how long.
	CrashedConsumer string
	CrashTakeover   bool
	CrashRecovery   time.Duration
	// RedeliversWhileRunning (set too for a broker with Redeliver) and
	// Serialized are the broker's, for Check.
	RedeliversWhileRunning, Serialized bool
}

// MaxStoreCallsPerSecond bounds the store calls while the slow order
// runs: its duplicates poll the store with backoff (50ms doubling to 1s),
// a handful of calls a second; a duplicate spinning in a nack loop would
// make thousands.
const MaxStoreCallsPerSecond = 40

// Check verifies the report: every order charged exactly once, the failed
// one retried, no in-flight duplicate acked, no hot loop.
func (r Report) Check() error {
	var errs []error
	if len(r.Applied) != r.Orders {
		errs = append(errs, fmt.Errorf("%d of %d orders charged", len(r.Applied), r.Orders))
	}
	for _, order := range slices.Sorted(maps.Keys(r.Applied)) {
		if n := r.Applied[order]; n != 1 {
			errs = append(errs, fmt.Errorf("order %s charged %d times", order, n))
		}
	}
	if r.Outcomes[idempotency.OutcomeHandlerFailed.String()] < 1 || r.Applied[FlakyOrder] != 1 {
		errs = append(errs, errors.New("the flaky order was not failed once and retried"))
	}
	if r.Poisoned != 0 {
		errs = append(errs, fmt.Errorf("%d messages sent to the poison queue", r.Poisoned))
	}
	if r.Outcomes[idempotency.OutcomeStoreError.String()] < 1 || r.Applied[OutageOrder] != 1 {
		errs = append(errs, errors.New("the outage order did not meet a store error and then get charged"))
	}
	if len(r.AckedEarly) > 0 {
		errs = append(errs, fmt.Errorf("duplicates acked while their order was in progress, before it was charged: %v", r.AckedEarly))
	}
	if r.SlowRun > 0 && float64(r.StoreCallsWhileSlow)/r.SlowRun.Seconds() > MaxStoreCallsPerSecond {
		errs = append(errs, fmt.Errorf("hot loop: %d store calls in the %v the slow order ran", r.StoreCallsWhileSlow, r.SlowRun))
	}
	if r.SlowInFlight < 1 && !r.Serialized {
		errs = append(errs, fmt.Errorf("the slow order was delivered %d times, never while it ran", r.SlowDeliveries))
	}
	if r.Outcomes[idempotency.OutcomeInProgress.String()] < 1 && !r.Serialized {
		errs = append(errs, errors.New("no duplicate was nacked while its order was in progress: the poison queue never met one"))
	}
	if !r.CrashTakeover {
		errs = append(errs, fmt.Errorf("the crash order was not charged by a consumer that took the crashed holder's lease over (crashed: %q)", r.CrashedConsumer))
	}
	if r.RedeliversWhileRunning && r.SlowRedelivered < 1 {
		errs = append(errs, fmt.Errorf("the broker did not redeliver the slow order's message while it ran (%d deliveries)", r.SlowDeliveries))
	}
	return errors.Join(errs...)
}

// String is the report's summary line.
func (r Report) String() string {
	var parts []string
	for _, o := range slices.Sorted(maps.Keys(r.Outcomes)) {
		parts = append(parts, fmt.Sprintf("%s=%d", o, r.Outcomes[o]))
	}
	return fmt.Sprintf("%s: %d messages for %d orders; outcomes %s; slow order delivered %d times, %d while it ran (%d redelivered by the broker while in progress), %d store calls in the %v it ran; crash order taken over %v after %s crashed: %v",
		r.Broker, r.Published, r.Orders, strings.Join(parts, " "), r.SlowDeliveries, r.SlowInFlight, r.SlowRedelivered, r.StoreCallsWhileSlow, r.SlowRun.Round(10*time.Millisecond),
		r.CrashRecovery.Round(10*time.Millisecond), r.CrashedConsumer, r.CrashTakeover)
}

// Run tells the story on b with the leases in store: orders regular
// orders, each published twice, plus the slow, the flaky and the outage
// order; once they are settled, the crash order. It prints the deliveries that were not plain successes or
// duplicates to w, and returns the report once every message is settled
// and the consumers are closed, or an error if they could not be (ctx
// ended). Report.Check gives the verdict.
func Run(ctx context.Context, b Broker, store backends.Store, orders int, w io.Writer) (Report, error) {
	if b.SlowFor == 0 {
		b.SlowFor = 2 * time.Second
	}
	if b.DeliveriesPerMessage == 0 {
		b.DeliveriesPerMessage = 1
	}
	if b.SlowCopies == 0 {
		b.SlowCopies = 2
	}
	var (
		calls    atomic.Int64
		sink     = storetest.NewSink()
		mu       sync.Mutex
		rep      = Report{Broker: b.Name, Orders: orders + 3, Outcomes: map[string]int64{}, RedeliversWhileRunning: b.RedeliversWhileRunning || b.Redeliver != nil, Serialized: b.Serialized}
		acked    atomic.Int64
		inFlight atomic.Int64
		// Deliveries handed to a router and deliveries done: a router's
		// Close can return while a delivery it took during closing still
		// runs, so the run ends when the two agree.
		handed   atomic.Int64
		finished atomic.Int64
		failed   atomic.Bool
		slowRan  = make(chan struct{})
		slowOnce sync.Once
		// The slow order's messages being handled, by UUID.
		slowActive    = map[string]int{}
		redeliverOnce sync.Once
		// The crash: which consumer crashed and when, and the closing of
		// its router; then the acked charge of the crash order.
		crashed      atomic.Bool
		crashAt      time.Time
		crashClosed  = make(chan error, 1)
		crashCharged = make(chan struct{})
		crashOnce    sync.Once
	)
	counted := &outage{Store: storetest.Counted(store, &calls), key: namespace + ":" + OutageOrder, failures: 2}
	poisoned := &countingPublisher{}
	poison, err := wmmiddleware.PoisonQueueWithFilter(poisoned, "poison", idempotency.IsPoison)
	if err != nil {
		return rep, err
	}
	snapshot := func() Report {
		mu.Lock()
		defer mu.Unlock()
		out := rep
		out.Outcomes = maps.Clone(rep.Outcomes)
		return out
	}
	observer := idempotency.ObserverFunc(func(_ context.Context, ev idempotency.Event) {
		mu.Lock()
		defer mu.Unlock()
		rep.Outcomes[ev.Outcome.String()]++
		if ev.Acked() {
			acked.Add(1)
		}
		if ev.Key == namespace+":"+SlowOrder {
			rep.SlowDeliveries++
			if ev.Waited > 0 || ev.Outcome == idempotency.OutcomeInProgress {
				rep.SlowInFlight++
			}
		}
		if ev.Key == namespace+":"+CrashOrder && ev.Outcome == idempotency.OutcomeProcessed && ev.Acked() {
			crashOnce.Do(func() {
				rep.CrashTakeover, rep.CrashRecovery = ev.Lease.Takeover, time.Since(crashAt)
				close(crashCharged)
			})
		}
		if ev.Outcome == idempotency.OutcomeDuplicate {
			if done, _ := sink.Applied(ev.Key); !done {
				rep.AckedEarly = append(rep.AckedEarly, ev.Key)
			}
		}
		if ev.Outcome != idempotency.OutcomeProcessed && ev.Outcome != idempotency.OutcomeDuplicate {
			fmt.Fprintf(w, "  %-10s %-12s %s: %v\n", ev.Handler, strings.TrimPrefix(ev.Key, namespace+":"), ev.Outcome, ev.Err)
		}
	})
	track := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			inFlight.Add(1)
			defer finished.Add(1)
			defer inFlight.Add(-1)
			if msg.Metadata.Get("order_id") == SlowOrder {
				mu.Lock()
				if slowActive[msg.UUID] > 0 {
					rep.SlowRedelivered++
				}
				slowActive[msg.UUID]++
				mu.Unlock()
				defer func() {
					mu.Lock()
					slowActive[msg.UUID]--
					mu.Unlock()
				}()
			}
			return h(msg)
		}
	}
	charge := func(msg *message.Message, consumer int) error {
		lease, ok := idempotency.LeaseFromContext(msg.Context())
		if !ok {
			return errors.New("no lease in the handler's context")
		}
		switch order := msg.Metadata.Get("order_id"); {
		case order == SlowOrder:
			start, startCalls := time.Now(), calls.Load()
			if b.Redeliver != nil {
				redeliverOnce.Do(func() { go b.Redeliver(routerNames[consumer]) })
			}
			select {
			case <-time.After(b.SlowFor):
			case <-msg.Context().Done():
				return msg.Context().Err()
			}
			slowOnce.Do(func() {
				mu.Lock()
				rep.SlowRun, rep.StoreCallsWhileSlow = time.Since(start), calls.Load()-startCalls
				mu.Unlock()
				close(slowRan)
			})
		case order == FlakyOrder && failed.CompareAndSwap(false, true):
			return errors.New("payment gateway timeout")
		}
		return sink.Apply(lease)
	}

	var routers []*message.Router
	// crash stops the consumer's store calls and closes its router, as
	// the death of its process would, and holds the delivery until the
	// middleware gives up the lease it can no longer renew.
	crash := func(msg *message.Message, consumer int, store *crashable) error {
		mu.Lock()
		crashAt, rep.CrashedConsumer = time.Now(), routerNames[consumer]
		router := routers[consumer]
		mu.Unlock()
		store.dead.Store(true)
		if b.Crash != nil {
			b.Crash(routerNames[consumer])
		}
		go func() { crashClosed <- router.Close() }()
		<-msg.Context().Done()
		return fmt.Errorf("crashed: %w", context.Cause(msg.Context()))
	}
	handler := func(consumer int, store *crashable) message.NoPublishHandlerFunc {
		return func(msg *message.Message) error {
			if msg.Metadata.Get("order_id") == CrashOrder && crashed.CompareAndSwap(false, true) {
				return crash(msg, consumer, store)
			}
			return charge(msg, consumer)
		}
	}

	logger := watermill.NopLogger{}
	closeAll := func() error {
		var errs []error
		for _, r := range routers {
			errs = append(errs, r.Close())
		}
		return errors.Join(errs...)
	}
	defer closeAll() //nolint:errcheck // closed below, or the run failed anyway
	for i, consumer := range routerNames {
		sub, err := b.Subscriber(consumer)
		if err != nil {
			return snapshot(), fmt.Errorf("%s subscriber: %w", consumer, err)
		}
		sub = &handing{Subscriber: sub, n: &handed}
		store := &crashable{Store: counted}
		cfg := idempotency.Config{
			Store:     store,
			Key:       keyfunc.Metadata("order_id"),
			Namespace: namespace,
			LeaseTTL:  5 * time.Second,
			Observer:  idempotency.MultiObserver(observer, b.Observer),
			// Short, so that the outage order's store-error nacks come
			// back soon.
			Timing: idempotency.Timing{
				StoreBackoff:   idempotency.Backoff{Max: 50 * time.Millisecond},
				InProgressWait: b.SlowFor / 4,
			},
		}
		if b.Configure != nil {
			b.Configure(&cfg)
		}
		idem, err := idempotency.New(cfg)
		if err != nil {
			return snapshot(), err
		}
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, logger)
		if err != nil {
			return snapshot(), err
		}
		if b.SetupRouter != nil {
			b.SetupRouter(router)
		}
		router.AddMiddleware(poison, track)
		router.AddMiddleware(b.Middleware...)
		router.AddMiddleware(idem.Middleware)
		router.AddConsumerHandler(consumer, b.Topic, sub, handler(i, store))
		mu.Lock()
		routers = append(routers, router)
		mu.Unlock()
		go func() { _ = router.Run(ctx) }()
		select {
		case <-router.Running():
		case <-ctx.Done():
			return snapshot(), ctx.Err()
		}
	}

	publish := func(order string, copies int) error {
		for attempt := range copies {
			msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order_id":%q}`, order)))
			msg.Metadata.Set("order_id", order)
			// Which of the producer's attempts this is: a broker may
			// partition by it, so that the copies go different ways.
			msg.Metadata.Set(AttemptMetadata, strconv.Itoa(attempt))
			if err := b.Publisher.Publish(b.Topic, msg); err != nil {
				return fmt.Errorf("publish %s: %w", order, err)
			}
			rep.Published++
		}
		return nil
	}
	copies := "1 copy"
	if b.SlowCopies > 1 {
		copies = fmt.Sprintf("%d copies at once", b.SlowCopies)
	}
	fmt.Fprintf(w, "%s: the slow order (%s), the flaky order, the outage order, then %d orders twice each\n", b.Name, copies, orders)
	if err := publish(SlowOrder, b.SlowCopies); err != nil {
		return snapshot(), err
	}
	if err := publish(FlakyOrder, 1); err != nil {
		return snapshot(), err
	}
	if err := publish(OutageOrder, 1); err != nil {
		return snapshot(), err
	}
	select {
	case <-slowRan:
	case <-ctx.Done():
		return snapshot(), fmt.Errorf("the slow order never finished: %w", ctx.Err())
	}
	for i := range orders {
		if err := publish(fmt.Sprintf("order-%03d", i), 2); err != nil {
			return snapshot(), err
		}
	}

	// Settled when every order is charged, every message acked at least
	// once, and no delivery is in flight.
	for {
		tally, _, _ := sink.Tally()
		if len(tally) == rep.Orders && acked.Load() >= int64(rep.Published*b.DeliveriesPerMessage) && inFlight.Load() == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return snapshot(), fmt.Errorf("not settled: %d of %d orders charged, %d of %d deliveries acked: %w",
				len(tally), rep.Orders, acked.Load(), rep.Published*b.DeliveriesPerMessage, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	// The crash: one consumer takes the crash order and dies holding it.
	// The broker must bring it to the other, which takes the dead
	// holder's lease over once it has run out.
	rep.Orders++
	if err := publish(CrashOrder, 1); err != nil {
		return snapshot(), err
	}
	var crashCloseErr error
	for closed := false; ; {
		select {
		case crashCloseErr = <-crashClosed:
			closed = true
		case <-crashCharged:
			crashCharged = nil
		case <-ctx.Done():
			return snapshot(), fmt.Errorf("the crash order was not charged after the crash (charged: %v, crashed router closed: %v): %w",
				crashCharged == nil, closed, ctx.Err())
		}
		if closed && crashCharged == nil {
			break
		}
	}
	if crashCloseErr != nil {
		fmt.Fprintf(w, "  closing the crashed consumer: %v\n", crashCloseErr)
	}
	if err := closeAll(); err != nil {
		return snapshot(), fmt.Errorf("closing the consumers: %w", err)
	}
	for finished.Load() < handed.Load() {
		select {
		case <-ctx.Done():
			return snapshot(), fmt.Errorf("routers closed with %d deliveries still running: %w", handed.Load()-finished.Load(), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	tally, refused, err := sink.Tally()
	if err != nil {
		return snapshot(), err
	}
	mu.Lock()
	defer mu.Unlock()
	rep.StaleRefused = refused
	rep.Poisoned = poisoned.n.Load()
	rep.Applied = make(map[string]int, len(tally))
	for key, t := range tally {
		rep.Applied[strings.TrimPrefix(key, namespace+":")] = t.Applied
	}
	// The caller gets outcomes of its own.
	out := rep
	out.Outcomes = maps.Clone(rep.Outcomes)
	return out, nil
}

// routerNames are the consumers' names, and their handlers'.
var routerNames = []string{"consumer-a", "consumer-b"}

// crashable is one consumer's store: once dead, every call the
// middleware makes fails, as it would from a process that is gone.
type crashable struct {
	backends.Store
	dead atomic.Bool
}

var errCrashed = fmt.Errorf("%w: the consumer crashed", backends.ErrRejected)

func (c *crashable) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	if c.dead.Load() {
		return backends.AcquireResult{}, errCrashed
	}
	return c.Store.Acquire(ctx, req)
}

func (c *crashable) Renew(ctx context.Context, lease backends.Lease, ttl time.Duration) error {
	if c.dead.Load() {
		return errCrashed
	}
	return c.Store.Renew(ctx, lease, ttl)
}

func (c *crashable) Complete(ctx context.Context, lease backends.Lease, output []byte) error {
	if c.dead.Load() {
		return errCrashed
	}
	return c.Store.Complete(ctx, lease, output)
}

// Watch keeps the store's backends.Watcher: waiting duplicates are woken
// by the holder's completion. A crashed consumer cannot watch.
func (c *crashable) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	if c.dead.Load() {
		return nil, func() {}, false
	}
	return storekit.WatchOf(ctx, c.Store, key)
}

func (c *crashable) Release(ctx context.Context, lease backends.Lease) error {
	if c.dead.Load() {
		return errCrashed
	}
	return c.Store.Release(ctx, lease)
}

// outage fails the first acquisitions of one key, as a store that is down
// for a moment would.
type outage struct {
	backends.Store
	key      string
	mu       sync.Mutex
	failures int
}

func (o *outage) Acquire(ctx context.Context, req backends.AcquireRequest) (backends.AcquireResult, error) {
	if req.Key == o.key {
		o.mu.Lock()
		fail := o.failures > 0
		if fail {
			o.failures--
		}
		o.mu.Unlock()
		if fail {
			return backends.AcquireResult{}, fmt.Errorf("%w: the store is down", backends.ErrRejected)
		}
	}
	return o.Store.Acquire(ctx, req)
}

// handing counts the messages its subscriber hands to the router. It
// closes its channel only after the subscriber's, and the router reads
// until then, so every message counted reaches a handler.
type handing struct {
	message.Subscriber
	n *atomic.Int64
}

func (h *handing) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := h.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for msg := range in {
			h.n.Add(1)
			out <- msg
		}
	}()
	return out, nil
}

// Watch keeps the store's backends.Watcher.
func (o *outage) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	return storekit.WatchOf(ctx, o.Store, key)
}

// countingPublisher counts what the poison queue publishes.
type countingPublisher struct{ n atomic.Int64 }

func (p *countingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.n.Add(int64(len(msgs)))
	return nil
}

func (p *countingPublisher) Close() error { return nil }
