package storetest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-idempotency/idempotency/backends"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// stormTopic is the topic every instance of a storm consumes;
// stormNamespace is every key's namespace.
const (
	stormTopic     = "in"
	stormNamespace = "storm"
)

// stormPayload is the payload, and the key without its namespace, of key k.
func stormPayload(k int) string { return fmt.Sprintf("order-%d", k) }

// stormKey is the full idempotency key of key k.
func stormKey(k int) string { return stormNamespace + ":" + stormPayload(k) }

// errInjected is the failure the default storm handler injects.
var errInjected = errors.New("storetest: injected handler failure")

// Storm is a storm of duplicates against a store: several Watermill
// routers, each with its own GoChannel and its own store (as separate
// service instances have), receive copies of the same keys at once and
// apply each key's effect through fenced [Effects]. [Storm.Run] fails the
// test unless the promise held: every key's effect applied exactly once,
// no delivery acked before its key's effect was applied. Its [Report]
// measures, besides, how often the lease alone (without the fence) held.
//
// Copy c of key k goes to instance (k+c) mod Instances under a new message
// UUID, as a producer retry would, all copies at once.
type Storm struct {
	// Instances is how many routers receive the copies, Keys how many
	// keys they carry, and Copies how many copies of each key are sent.
	Instances, Keys, Copies int
	// Store returns instance i's store. Required.
	Store func(t testing.TB, i int) backends.Store
	// Configure adjusts every instance's middleware config (Store, Key,
	// Namespace and Observer are set by the storm).
	Configure func(c *idempotency.Config)
	// Effects is where the handlers apply their effects. Defaults to a new
	// [Sink], written by the default handler.
	Effects Effects
	// Handler returns instance i's handler, which must apply its key's
	// effect to Effects. Defaults to a handler that fails before its
	// effect on the first attempt of every third key, then applies the
	// effect to the Sink (a Handler must be given with other Effects).
	Handler func(i int) message.HandlerFunc
	// Workers, if positive, bounds the deliveries each instance handles at
	// once, as a broker consumer's worker count would.
	Workers int
	// Flaky is the fraction of store calls that fail as a network would:
	// half before the store sees them, half after it applied them.
	Flaky float64
	// Timeout bounds the wait for every delivery to be acked.
	// Defaults to 3 minutes.
	Timeout time.Duration
}

// failsFirst reports whether the default handler fails key's first
// attempt: every third key does.
func failsFirst(key string) bool {
	h := fnv.New32a()
	h.Write([]byte(key))
	return h.Sum32()%3 == 0
}

// Run runs the storm until every delivery was acked, logs its report, and
// fails the test unless the storm kept the promise: every key's effect
// applied exactly once, no delivery acked before its key's effect was
// applied, completions recorded for all but at most 0.1% of keys, and, in
// a run where no lease was lost or taken over, no key's write reached by
// two leases. It fails the test too if the deliveries are not all acked
// within Timeout. The report is returned for the caller's own checks.
func (s Storm) Run(t testing.TB) Report {
	t.Helper()
	if s.Timeout == 0 {
		s.Timeout = 3 * time.Minute
	}
	var sink *Sink
	if s.Effects == nil {
		sink = NewSink()
		s.Effects = sink
	}
	st := &state{effects: s.Effects}
	pubs := make([]*gochannel.GoChannel, s.Instances)
	for i := range s.Instances {
		store := &counted{Store: s.Store(t, i), calls: &st.calls}
		if s.Flaky > 0 {
			store.Store = &flaky{Store: store.Store, rate: s.Flaky}
		}
		counters := &idempotency.Counters{}
		st.counters = append(st.counters, counters)
		cfg := idempotency.Config{}
		if s.Configure != nil {
			s.Configure(&cfg)
		}
		cfg.Store, cfg.Namespace = store, stormNamespace
		cfg.Key = payloadKey{}
		cfg.Observer = observer{counters: counters, st: st}
		idem, err := idempotency.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var h message.HandlerFunc
		if s.Handler != nil {
			h = s.Handler(i)
		} else {
			h = defaultHandler(sink)
		}
		pubs[i] = startInstance(t, idem.Middleware(h), s.Workers)
	}

	start := time.Now()
	publishCopies(t, pubs, s.Keys, s.Copies)
	st.waitAcked(t, int64(s.Keys*s.Copies), s.Timeout)
	r := st.report(t, s, time.Since(start))
	r.check(t)
	return r
}

func defaultHandler(sink *Sink) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		lease, ok := idempotency.LeaseFromContext(msg.Context())
		if !ok {
			return nil, errors.New("storetest: no lease in the handler's context")
		}
		if lease.Attempt == 1 && failsFirst(lease.Key) {
			return nil, errInjected
		}
		return nil, sink.Apply(lease)
	}
}

// payloadKey uses the payload as the key.
type payloadKey struct{}

func (payloadKey) Key(msg *message.Message) (string, error) { return string(msg.Payload), nil }

func startInstance(t testing.TB, h message.HandlerFunc, workers int) *gochannel.GoChannel {
	t.Helper()
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 256}, logger)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	var slots chan struct{}
	if workers > 0 {
		slots = make(chan struct{}, workers)
	}
	r.AddConsumerHandler("h", stormTopic, ps, func(msg *message.Message) error {
		if slots != nil {
			slots <- struct{}{}
			defer func() { <-slots }()
		}
		_, err := h(msg)
		return err
	})
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() { _ = r.Close(); _ = ps.Close() })
	return ps
}

func publishCopies(t testing.TB, pubs []*gochannel.GoChannel, keys, copies int) {
	t.Helper()
	var wg sync.WaitGroup
	for c := range copies {
		wg.Go(func() {
			for k := range keys {
				msg := message.NewMessage(watermill.NewUUID(), []byte(stormPayload(k)))
				if err := pubs[(k+c)%len(pubs)].Publish(stormTopic, msg); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// state is what a running storm collects.
type state struct {
	effects  Effects
	counters []*idempotency.Counters
	calls    atomic.Int64

	mu            sync.Mutex
	ackedNoEffect []string
	errs          []error
}

// observer counts outcomes and checks, at the moment a delivery is about
// to be acked, that its key's effect has been applied.
type observer struct {
	counters *idempotency.Counters
	st       *state
}

func (o observer) Observe(ctx context.Context, ev idempotency.Event) {
	if ev.Outcome.Acked() {
		ok, err := o.st.effects.Applied(ev.Key)
		o.st.mu.Lock()
		switch {
		case err != nil:
			o.st.errs = append(o.st.errs, err)
		case !ok:
			o.st.ackedNoEffect = append(o.st.ackedNoEffect, fmt.Sprintf("%s (%s)", ev.Key, ev.Outcome))
		}
		o.st.mu.Unlock()
	}
	// Count last: a test waiting for the counts then sees the check done.
	o.counters.Observe(ctx, ev)
}

func (st *state) count(o idempotency.Outcome) (n int64) {
	for _, c := range st.counters {
		n += c.Count(o)
	}
	return n
}

func (st *state) acked() (n int64) {
	for _, o := range idempotency.Outcomes() {
		if o.Acked() {
			n += st.count(o)
		}
	}
	return n
}

func (st *state) outcomes() map[string]int64 {
	m := map[string]int64{}
	for _, o := range idempotency.Outcomes() {
		if n := st.count(o); n != 0 {
			m[o.String()] = n
		}
	}
	return m
}

func (st *state) waitAcked(t testing.TB, n int64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := st.acked()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("storetest: %d of %d deliveries acked after %v; outcomes: %v", got, n, timeout, st.outcomes())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Report is what a storm measured.
type Report struct {
	// Instances and Keys are the storm's; Deliveries is how many copies
	// were delivered in all.
	Instances, Keys, Deliveries int
	// Lost lists keys whose effect was never applied.
	Lost []string
	// DoubleApplied lists keys whose effect the sink applied more than once.
	DoubleApplied []string
	// UnfencedDouble lists keys whose write was reached by more than one
	// lease: an unfenced sink would have applied them more than once.
	UnfencedDouble []string
	// AckedWithoutEffect lists deliveries acked while their key's effect
	// was not applied.
	AckedWithoutEffect []string
	// Refused counts the stale writes the fence refused.
	Refused int64
	// Outcomes counts deliveries by outcome.
	Outcomes map[string]int64
	// Takeovers counts acquisitions that took over an expired lease.
	Takeovers int64
	// StoreCalls counts the middleware's store calls.
	StoreCalls int64
	// Elapsed is how long the storm took.
	Elapsed time.Duration
	// Errors are the errors met reading the effects while checking an
	// ack.
	Errors []error
}

func (st *state) report(t testing.TB, s Storm, elapsed time.Duration) Report {
	t.Helper()
	tallies, refused, err := st.effects.Tally()
	if err != nil {
		t.Fatalf("storetest: tally: %v", err)
	}
	r := Report{
		Instances: s.Instances, Keys: s.Keys, Deliveries: s.Keys * s.Copies,
		Refused: refused, Outcomes: st.outcomes(), StoreCalls: st.calls.Load(), Elapsed: elapsed,
	}
	for _, c := range st.counters {
		r.Takeovers += c.Takeovers()
	}
	for k := range s.Keys {
		key := stormKey(k)
		switch t := tallies[key]; {
		case t.Applied == 0:
			r.Lost = append(r.Lost, key)
		case t.Applied > 1:
			r.DoubleApplied = append(r.DoubleApplied, fmt.Sprintf("%s (%d times)", key, t.Applied))
		}
		if tallies[key].Holders > 1 {
			r.UnfencedDouble = append(r.UnfencedDouble, key)
		}
	}
	st.mu.Lock()
	r.AckedWithoutEffect = slices.Clone(st.ackedNoEffect)
	r.Errors = slices.Clone(st.errs)
	st.mu.Unlock()
	return r
}

// NotRecorded counts deliveries acked without their completion recorded.
func (r Report) NotRecorded() int64 {
	return r.Outcomes[idempotency.OutcomeProcessedNotRecorded.String()]
}

// LeasesLost counts deliveries whose lease was lost while they ran.
func (r Report) LeasesLost() int64 { return r.Outcomes[idempotency.OutcomeLeaseLost.String()] }

// String is the report on one line.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d instances × %d keys × %d copies in %v: double-applied fenced effects %d, "+
		"unfenced double completions %d, lost %d, acked without effect %d, stale writes refused %d, "+
		"processed_not_recorded %d (%.3f%% of keys), leases lost %d, takeovers %d, store calls per delivery %.2f; outcomes",
		r.Instances, r.Keys, r.Deliveries/max(r.Keys, 1), r.Elapsed.Round(time.Millisecond),
		len(r.DoubleApplied), len(r.UnfencedDouble), len(r.Lost), len(r.AckedWithoutEffect), r.Refused,
		r.NotRecorded(), 100*float64(r.NotRecorded())/float64(max(r.Keys, 1)), r.LeasesLost(), r.Takeovers,
		float64(r.StoreCalls)/float64(max(r.Deliveries, 1)))
	for _, o := range slices.Sorted(maps.Keys(r.Outcomes)) {
		fmt.Fprintf(&b, " %s=%d", o, r.Outcomes[o])
	}
	return b.String()
}

// check logs the report and fails the test unless the storm kept the
// promise, as [Storm.Run] states it.
func (r Report) check(t testing.TB) {
	t.Helper()
	t.Log(r.String())
	for _, err := range r.Errors {
		t.Errorf("storetest: %v", err)
	}
	if len(r.Lost) > 0 {
		t.Errorf("%d keys lost their effect, e.g. %v", len(r.Lost), first(r.Lost))
	}
	if len(r.DoubleApplied) > 0 {
		t.Errorf("%d keys had their effect applied more than once, e.g. %v", len(r.DoubleApplied), first(r.DoubleApplied))
	}
	if len(r.AckedWithoutEffect) > 0 {
		t.Errorf("%d deliveries were acked before their key's effect was applied, e.g. %v", len(r.AckedWithoutEffect), first(r.AckedWithoutEffect))
	}
	if r.NotRecorded()*1000 > int64(r.Keys) {
		t.Errorf("%d deliveries processed without their completion recorded: more than 0.1%% of %d keys", r.NotRecorded(), r.Keys)
	}
	if r.LeasesLost() == 0 && r.Takeovers == 0 && len(r.UnfencedDouble) > 0 {
		t.Errorf("no lease was lost, yet %d keys were run to their effect by two leases, e.g. %v", len(r.UnfencedDouble), first(r.UnfencedDouble))
	}
}

func first(s []string) []string { return s[:min(len(s), 5)] }
