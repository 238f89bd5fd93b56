package main

// The demonstration, apart from the service: a producer that sends what
// producers and brokers really send, and a check of what happened. The
// check reads only what an operator can see: the ledger, the streams and
// /metrics. Every claim it prints is computed from them; the program exits
// non-zero if one is false.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"
)

// demoOrders is how many ordinary orders the demo sends, each twice.
const demoOrders = 20

// The orders with a story.
const (
	slowOrder  = "order-slow"  // its payment takes slowCharge
	flakyOrder = "order-flaky" // its payment fails three times
)

type demo struct {
	logger     *slog.Logger
	client     *redis.Client
	pub        message.Publisher
	ledger     *ledger
	metricsURL string
	stream     string
	group      string
	poison     string

	done chan struct{} // closed once produce has returned
	// Set by produce, read once done is closed.
	err           error
	orders        []string // every order sent, once each
	orderMessages int      // messages sent that carry an order
	published     int      // messages sent
	malformed     string   // the UUID of the message without an order id
	// slowDeliveries is the most deliveries of the slow order's entry
	// XPENDING showed while it ran: more than one, and Redis Streams
	// redelivered it (claimed it for a consumer) while its first
	// delivery still ran.
	slowDeliveries int64
}

// startDemo starts producing once running is closed. The context it
// returns ends once every message is settled, or the demo failed: the
// service runs until then.
func startDemo(ctx context.Context, cfg config, running <-chan struct{}, metricsURL string, logger *slog.Logger) (*demo, context.Context, error) {
	client := redis.NewClient(&redis.Options{Addr: cfg.redisAddr, ContextTimeoutEnabled: true})
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, watermill.NopLogger{})
	if err != nil {
		return nil, nil, err
	}
	d := &demo{
		logger:     logger,
		client:     client,
		pub:        pub,
		ledger:     &ledger{client: client, prefix: cfg.prefix + "ledger:"},
		metricsURL: metricsURL,
		stream:     cfg.prefix + "orders",
		group:      cfg.prefix + "billing",
		poison:     cfg.prefix + "orders.poison",
		done:       make(chan struct{}),
	}
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer cancel()
		defer close(d.done)
		select {
		case <-running:
			d.err = d.produce(ctx)
		case <-ctx.Done():
			d.err = ctx.Err()
		}
	}()
	return d, ctx, nil
}

// produce sends the demo's messages and returns once they are settled.
func (d *demo) produce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	publish := func(payload []byte) (string, error) {
		uuid := watermill.NewUUID()
		if err := d.pub.Publish(d.stream, message.NewMessage(uuid, payload)); err != nil {
			return "", err
		}
		d.published++
		return uuid, nil
	}
	send := func(o order, copies int) error {
		payload, err := json.Marshal(o)
		if err != nil {
			return err
		}
		d.orders = append(d.orders, o.ID)
		for range copies {
			if _, err := publish(payload); err != nil {
				return err
			}
			d.orderMessages++
		}
		return nil
	}

	// The slow order, alone: while its payment runs, its entry is idle
	// past maxIdleTime, and Redis Streams hands it to a consumer again.
	d.logger.Info("demo: sending the slow order")
	if err := send(order{ID: slowOrder, AmountCents: 5000, Simulate: "slow"}, 1); err != nil {
		return err
	}
	for {
		if e, err := d.ledger.entries(ctx); err == nil && e[slowOrder].Charges > 0 {
			break
		}
		pending, err := d.client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: d.stream, Group: d.group, Start: "-", End: "+", Count: 10}).Result()
		if err == nil {
			for _, p := range pending {
				d.slowDeliveries = max(d.slowDeliveries, p.RetryCount)
			}
		}
		if err := pause(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("the slow order was not charged: %w", err)
		}
	}

	d.logger.Info("demo: sending the flaky order, a message without an order id, and every other order twice")
	if err := send(order{ID: flakyOrder, AmountCents: 700, Simulate: "flaky"}, 1); err != nil {
		return err
	}
	var err error
	if d.malformed, err = publish([]byte(`{"amount_cents":100}`)); err != nil {
		return err
	}
	for i := range demoOrders {
		if err := send(order{ID: fmt.Sprintf("order-%03d", i+1), AmountCents: int64(1000 + i)}, 2); err != nil {
			return err
		}
	}

	// Settled: every order charged, and every entry delivered and acked.
	for {
		charged, drained, err := d.settled(ctx)
		if err == nil && charged == len(d.orders) && drained {
			d.logger.Info("demo: every message settled")
			return nil
		}
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("not settled: %d of %d orders charged, stream drained: %v: %w", charged, len(d.orders), drained, err)
		}
	}
}

// settled reports how many orders are charged, and whether the consumer
// group has read every entry and has none pending.
func (d *demo) settled(ctx context.Context) (charged int, drained bool, err error) {
	entries, err := d.ledger.entries(ctx)
	if err != nil {
		return 0, false, err
	}
	stream, err := d.client.XInfoStream(ctx, d.stream).Result()
	if err != nil {
		return len(entries), false, err
	}
	groups, err := d.client.XInfoGroups(ctx, d.stream).Result()
	if err != nil {
		return len(entries), false, err
	}
	for _, g := range groups {
		if g.Name == d.group {
			drained = g.Pending == 0 && g.LastDeliveredID == stream.LastGeneratedID
		}
	}
	return len(entries), drained, nil
}

func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// verdict prints the summary and the check of what happened, once the
// service has shut down; it returns an error if a claim is false.
func (d *demo) verdict(ctx context.Context) error {
	<-d.done
	defer d.client.Close()
	defer d.pub.Close()
	if d.err != nil {
		fmt.Printf("Check FAILED: %v\n", d.err)
		return d.err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	obs := observations{
		orders: d.orders, orderMessages: d.orderMessages, published: d.published, malformed: d.malformed,
		slowDeliveries: int(d.slowDeliveries),
	}
	var err error
	if obs.ledger, err = d.ledger.entries(ctx); err != nil {
		return err
	}
	if obs.streamLen, err = d.client.XLen(ctx, d.stream).Result(); err != nil {
		return err
	}
	poisoned, err := d.client.XRange(ctx, d.poison, "-", "+").Result()
	if err != nil {
		return err
	}
	for _, p := range poisoned {
		uuid, _ := p.Values[redisstream.UUIDHeaderKey].(string)
		obs.poisoned = append(obs.poisoned, uuid)
	}
	if obs.metrics, err = scrape(ctx, d.metricsURL); err != nil {
		return err
	}

	fmt.Println("Summary:")
	for _, line := range obs.sums() {
		fmt.Println(line)
	}
	if err := obs.check(); err != nil {
		fmt.Printf("Check FAILED: %v\n", err)
		return err
	}
	fmt.Println("Check: " + obs.claims())
	return nil
}

// observations is what the check reads: what the producer sent, and what
// the ledger, the streams and /metrics hold.
type observations struct {
	// Sent: the orders (once each), the messages that carry one, every
	// message, and the UUID of the one without an order id.
	orders        []string
	orderMessages int
	published     int
	malformed     string

	ledger    map[string]entry
	streamLen int64    // the orders stream's entries (XLEN)
	poisoned  []string // the poison stream's message UUIDs
	// slowDeliveries is the most deliveries of the slow order's entry
	// XPENDING showed while it ran.
	slowDeliveries int
	metrics        scraped
}

// scraped is what /metrics said.
type scraped struct {
	deliveries map[string]float64 // the middleware's deliveries by outcome
	waited     float64            // deliveries that waited for the key's holder
	executions float64            // Watermill's count of the router's handler runs: deliveries
	attempts   map[string]float64 // the handler's charge attempts by result
}

// sum is a line of the summary: a total and the parts it is made of,
// each read from where it happened. The check fails unless they add up.
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

// charges returns the ledger's charges, the orders it charged, and the
// charges of an order charged before.
func (o observations) charges() (total, orders, again int) {
	for _, e := range o.ledger {
		total += int(e.Charges)
		if e.Charges > 0 {
			orders++
			again += int(e.Charges) - 1
		}
	}
	return total, orders, again
}

// outcomes lists the middleware's deliveries by outcome, most first.
func (o observations) outcomes() []part {
	var parts []part
	for _, k := range slices.Sorted(maps.Keys(o.metrics.deliveries)) {
		parts = append(parts, part{int(o.metrics.deliveries[k]), k})
	}
	slices.SortStableFunc(parts, func(a, b part) int { return b.n - a.n })
	return parts
}

// sums are the lines of the summary.
func (o observations) sums() []sum {
	m := o.metrics
	charges, charged, again := o.charges()
	return []sum{
		{label: "messages on the orders stream (XLEN)", total: int(o.streamLen), parts: []part{
			{len(o.orders), "orders, a first copy of each"},
			{o.orderMessages - len(o.orders), "second copies, as a producer's retry sends them"},
			{o.published - o.orderMessages, "without an order id"}}},
		{label: "deliveries to the router (handler_execution_time_seconds_count)", total: int(m.executions), parts: []part{
			{int(o.streamLen), "messages, each delivered once"},
			{int(m.executions - float64(o.streamLen)), "delivered again: after a nack, or claimed by a consumer while idle"}}},
		{label: "the same deliveries by outcome (the middleware's count)", total: int(m.executions), parts: o.outcomes()},
		{label: "charge attempts (orders_charge_attempts_total)", total: int(m.attempts["charged"] + m.attempts["failed"]), parts: []part{
			{charges, "charges in the ledger"}, {int(m.attempts["failed"]), "failed"}}},
		{label: "charges in the ledger", total: charges, parts: []part{
			{charged, "orders charged"}, {again, "charges of an order charged before"}}},
		{label: "messages on the poison stream", total: len(o.poisoned), parts: []part{
			{int(m.deliveries["key_error"]), "key_error: no usable key, forwarded by the poison queue"}}},
	}
}

// flakyFailures is how many times the flaky order's payment fails
// (payments.go).
const flakyFailures = 3

// check returns every claim that is false.
func (o observations) check() error {
	var errs []error
	for _, s := range o.sums() {
		if err := s.check(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, id := range o.orders {
		if n := o.ledger[id].Charges; n != 1 {
			errs = append(errs, fmt.Errorf("order %s charged %d times", id, n))
		}
	}
	for id := range o.ledger {
		if !slices.Contains(o.orders, id) {
			errs = append(errs, fmt.Errorf("the ledger charged %s, an order never sent", id))
		}
	}
	m := o.metrics.deliveries
	if int(m["processed"]) != len(o.orders) {
		errs = append(errs, fmt.Errorf("/metrics counts %v processed deliveries for %d orders", m["processed"], len(o.orders)))
	}
	if second := o.orderMessages - len(o.orders); int(m["duplicate"]) < second {
		errs = append(errs, fmt.Errorf("/metrics counts %v duplicates for %d second copies", m["duplicate"], second))
	}
	if int(o.metrics.attempts["failed"]) != flakyFailures || m["handler_failed"] < 1 {
		errs = append(errs, fmt.Errorf("%v charge attempts failed in %v deliveries; the flaky order's payment fails %d times",
			o.metrics.attempts["failed"], m["handler_failed"], flakyFailures))
	}
	// Every message was acked by one of its deliveries, and a nacked
	// delivery is not that one: a message nacked n times was delivered
	// n times more than once.
	if again, nacked := o.metrics.executions-float64(o.streamLen), m["handler_failed"]+m["in_progress"]; again < nacked {
		errs = append(errs, fmt.Errorf("%v deliveries beyond one per message, for %v nacks", again, nacked))
	}
	if o.slowDeliveries < 2 {
		errs = append(errs, errors.New("the slow order's entry was not delivered again while it ran"))
	}
	if o.metrics.waited+m["in_progress"] < 1 {
		errs = append(errs, errors.New("no delivery found its order held by another consumer"))
	}
	if !slices.Equal(o.poisoned, []string{o.malformed}) {
		errs = append(errs, fmt.Errorf("the poison stream holds %v, not just the message without an order id (%s)", o.poisoned, o.malformed))
	}
	return errors.Join(errs...)
}

// claims states what check verified.
func (o observations) claims() string {
	m := o.metrics.deliveries
	second := o.orderMessages - len(o.orders)
	// Every delivery that found its order held waited for the holder
	// (the wait histogram counts it), then either saw the order charged
	// or gave up and was nacked in progress.
	inFlight := max(int(o.metrics.waited), int(m["in_progress"]))
	return fmt.Sprintf("%s charged exactly once each in the ledger, under fencing tokens; "+
		"the %s and %s of charged orders dropped as duplicates, uncharged; "+
		"the flaky order charged after %s in %s; "+
		"Redis Streams delivered the slow order's entry %s while it ran (%s), and %s found %s order held by another consumer and waited (%d of them then nacked in progress), none charged again; "+
		"only the message without an order id reached the poison stream; every sum above adds up.",
		count(len(o.orders), "order"), count(second, "second copy"), count(int(m["duplicate"])-second, "other delivery"),
		count(int(o.metrics.attempts["failed"]), "failed payment"), count(int(m["handler_failed"]), "failed delivery"),
		count(o.slowDeliveries, "time"), count(o.slowDeliveries-1, "claim"), count(inFlight, "delivery"), plural(inFlight, "its", "their"), int(m["in_progress"]))
}

// count is "1 order", "2 orders", "1 copy", "2 copies".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	switch {
	case strings.HasSuffix(noun, "y") && !strings.HasSuffix(noun, "ay"):
		noun = strings.TrimSuffix(noun, "y") + "ies"
	default:
		noun += "s"
	}
	return fmt.Sprintf("%d %s", n, noun)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// scrape fetches /metrics as Prometheus would.
func scrape(ctx context.Context, url string) (scraped, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return scraped{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return scraped{}, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return scraped{}, fmt.Errorf("scraping %s: %w", url, err)
	}
	return scraped{
		deliveries: sumBy(families["watermill_idempotency_deliveries_total"], "watermill_idempotency_outcome"),
		waited:     sumBy(families["watermill_idempotency_wait_duration_seconds"], "")[""],
		executions: sumBy(families["handler_execution_time_seconds"], "")[""],
		attempts:   sumBy(families["orders_charge_attempts_total"], "result"),
	}, nil
}

// sumBy adds up a counter's samples, or a histogram's counts, by the
// value of label.
func sumBy(f *dto.MetricFamily, label string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range f.GetMetric() {
		value := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				value = l.GetValue()
			}
		}
		out[value] += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
	}
	return out
}
