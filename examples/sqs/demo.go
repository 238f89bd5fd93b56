package main

// The demonstration, apart from the service: a producer that sends what
// producers and brokers really send, and a check of what happened. The
// check reads only what an operator can see: the ledger, the queues and
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
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"
)

// demoOrders is how many ordinary orders the demo sends, each twice.
const demoOrders = 20

// The orders with a story.
const (
	slowOrder  = "order-slow"  // its payment takes slowCharge; sent twice at once
	flakyOrder = "order-flaky" // its payment fails three times
)

type demo struct {
	logger     *slog.Logger
	sqs        *sqs.Client
	redis      *redis.Client
	pub        message.Publisher
	ledger     *ledger
	metricsURL string
	queue      string
	poison     string

	done chan struct{} // closed once produce has returned
	// Set by produce, read once done is closed.
	err           error
	orders        []string // every order sent, once each
	orderMessages int      // messages sent that carry an order
	published     int      // messages sent
	malformed     string   // the UUID of the message without an order id
}

// startDemo starts producing once running is closed. The context it
// returns ends once every message is settled, or the demo failed: the
// service runs until then.
func startDemo(ctx context.Context, cfg config, awsCfg aws.Config, endpoint []func(*sqs.Options), running <-chan struct{}, metricsURL string, logger *slog.Logger) (*demo, context.Context, error) {
	pub, err := wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: awsCfg, OptFns: endpoint, DoNotCreateQueueIfNotExists: true}, watermill.NopLogger{})
	if err != nil {
		return nil, nil, err
	}
	client := redis.NewClient(&redis.Options{Addr: cfg.redisAddr, ContextTimeoutEnabled: true})
	d := &demo{
		logger:     logger,
		sqs:        sqs.NewFromConfig(awsCfg, endpoint...),
		redis:      client,
		pub:        pub,
		ledger:     &ledger{client: client, prefix: cfg.prefix + "ledger:"},
		metricsURL: metricsURL,
		queue:      cfg.prefix + "orders",
		poison:     cfg.prefix + "orders-poison",
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
		if err := d.pub.Publish(d.queue, message.NewMessage(uuid, payload)); err != nil {
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

	// The slow order, twice at once, as a producer that retries at once
	// sends it: its copies arrive while it runs, and its payment outlasts
	// the visibility timeout, so SQS delivers its message again meanwhile.
	d.logger.Info("demo: sending the slow order twice")
	if err := send(order{ID: slowOrder, AmountCents: 5000, Simulate: "slow"}, 2); err != nil {
		return err
	}
	for {
		if e, err := d.ledger.entries(ctx); err == nil && e[slowOrder].Charges > 0 {
			break
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

	// Settled: every order charged, and every message deleted.
	for {
		charged, drained, err := d.settled(ctx)
		if err == nil && charged == len(d.orders) && drained {
			d.logger.Info("demo: every message settled")
			return nil
		}
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("not settled: %d of %d orders charged, queue drained: %v: %w", charged, len(d.orders), drained, err)
		}
	}
}

// settled reports how many orders are charged, and whether the queue is
// empty: every message deleted, none in flight or deferred.
func (d *demo) settled(ctx context.Context) (charged int, drained bool, err error) {
	entries, err := d.ledger.entries(ctx)
	if err != nil {
		return 0, false, err
	}
	url, err := d.sqs.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(d.queue)})
	if err != nil {
		return len(entries), false, err
	}
	attrs, err := d.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: url.QueueUrl,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible, types.QueueAttributeNameApproximateNumberOfMessagesDelayed},
	})
	if err != nil {
		return len(entries), false, err
	}
	drained = true
	for _, v := range attrs.Attributes {
		drained = drained && v == "0"
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
	defer d.redis.Close()
	defer d.pub.Close()
	if d.err != nil {
		fmt.Printf("Check FAILED: %v\n", d.err)
		return d.err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	obs := observations{orders: d.orders, orderMessages: d.orderMessages, published: d.published, malformed: d.malformed}
	var err error
	if obs.ledger, err = d.ledger.entries(ctx); err != nil {
		return err
	}
	if obs.poisoned, err = d.receivePoisoned(ctx); err != nil {
		return err
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

// receivePoisoned receives every message on the poison queue, and returns
// their UUIDs.
func (d *demo) receivePoisoned(ctx context.Context) ([]string, error) {
	url, err := d.sqs.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(d.poison)})
	if err != nil {
		return nil, err
	}
	var uuids []string
	for {
		res, err := d.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: url.QueueUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"},
		})
		if err != nil {
			return nil, err
		}
		if len(res.Messages) == 0 {
			return uuids, nil
		}
		for _, m := range res.Messages {
			uuids = append(uuids, aws.ToString(m.MessageAttributes[wsqs.UUIDAttribute].StringValue))
		}
	}
}

// observations is what the check reads: what the producer sent, and what
// the ledger, the poison queue and /metrics hold.
type observations struct {
	// Sent: the orders (once each), the messages that carry one, every
	// message, and the UUID of the one without an order id. SQS keeps no
	// count of the messages sent to a queue; the producer does.
	orders        []string
	orderMessages int
	published     int
	malformed     string

	ledger   map[string]entry
	poisoned []string // the poison queue's message UUIDs
	metrics  scraped
}

// scraped is what /metrics said.
type scraped struct {
	deliveries map[string]float64 // the middleware's deliveries by outcome
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
		{label: "messages sent to the orders queue (the producer's count)", total: o.published, parts: []part{
			{len(o.orders), "orders, a first copy of each"},
			{o.orderMessages - len(o.orders), "second copies, as a producer's retry sends them"},
			{o.published - o.orderMessages, "without an order id"}}},
		{label: "deliveries to the router (handler_execution_time_seconds_count)", total: int(m.executions), parts: []part{
			{o.published, "messages, each delivered once"},
			{int(m.executions) - o.published, "delivered again: SQS showed the message again after its visibility timeout or a deferral"}}},
		{label: "the same deliveries by outcome (the middleware's count)", total: int(m.executions), parts: o.outcomes()},
		{label: "charge attempts (orders_charge_attempts_total)", total: int(m.attempts["charged"] + m.attempts["failed"]), parts: []part{
			{charges, "charges in the ledger"}, {int(m.attempts["failed"]), "failed"}}},
		{label: "charges in the ledger", total: charges, parts: []part{
			{charged, "orders charged"}, {again, "charges of an order charged before"}}},
		{label: "messages on the poison queue", total: len(o.poisoned), parts: []part{
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
	if again, nacked := int(o.metrics.executions)-o.published, int(m["handler_failed"]+m["in_progress"]); again < nacked {
		errs = append(errs, fmt.Errorf("%d deliveries beyond one per message, for %d nacks", again, nacked))
	}
	if m["in_progress"] < 1 {
		errs = append(errs, errors.New("no delivery found its order held elsewhere and was nacked in progress"))
	}
	if !slices.Equal(o.poisoned, []string{o.malformed}) {
		errs = append(errs, fmt.Errorf("the poison queue holds %v, not just the message without an order id (%s)", o.poisoned, o.malformed))
	}
	return errors.Join(errs...)
}

// claims states what check verified.
func (o observations) claims() string {
	m := o.metrics.deliveries
	second := o.orderMessages - len(o.orders)
	return fmt.Sprintf("%s charged exactly once each in the ledger, under fencing tokens; "+
		"the %s and %s of charged orders dropped as duplicates, uncharged; "+
		"the flaky order charged after %s in %s; "+
		"%s nacked while %s order was held elsewhere, none charged again or poisoned; "+
		"only the message without an order id reached the poison queue; every sum above adds up.",
		count(len(o.orders), "order"), count(second, "second copy"), count(int(m["duplicate"])-second, "other delivery"),
		count(int(o.metrics.attempts["failed"]), "failed payment"), count(int(m["handler_failed"]), "failed delivery"),
		count(int(m["in_progress"]), "delivery"), plural(int(m["in_progress"]), "its", "their"))
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
