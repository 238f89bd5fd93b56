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
	err       error
	orders    []string // every order sent
	published int      // messages sent
	twice     int      // orders sent twice
	malformed string   // the UUID of the message without an order id
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
		d.twice++
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
	var obs observations
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
	obs.sent = sent{orders: d.orders, twice: d.twice, published: d.published, malformed: d.malformed}

	fmt.Println("Summary: " + obs.summary())
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

// sent is what the demo sent.
type sent struct {
	orders    []string
	twice     int
	published int
	malformed string
}

// observations is what the check reads.
type observations struct {
	sent     sent
	ledger   map[string]entry
	poisoned []string // the poison queue's message UUIDs
	metrics  scraped
}

// scraped is what /metrics said.
type scraped struct {
	deliveries map[string]float64 // the middleware's deliveries by outcome
	waited     float64            // deliveries that waited for the key's holder
	executions float64            // Watermill's count of handler runs
}

func (o observations) summary() string {
	outcomes := make([]string, 0, len(o.metrics.deliveries))
	for _, k := range slices.Sorted(maps.Keys(o.metrics.deliveries)) {
		outcomes = append(outcomes, fmt.Sprintf("%s=%v", k, o.metrics.deliveries[k]))
	}
	return fmt.Sprintf("%d messages: %d orders (%d of them sent twice), 1 without an order id; /metrics: deliveries %s, %v waited for a holder, %v handler runs; ledger: %s; poison queue: %s",
		o.sent.published, len(o.sent.orders), o.sent.twice, strings.Join(outcomes, " "), o.metrics.waited, o.metrics.executions,
		count(len(o.ledger), "order"), count(len(o.poisoned), "message"))
}

// check returns every claim that is false.
func (o observations) check() error {
	var errs []error
	for _, id := range o.sent.orders {
		if n := o.ledger[id].Charges; n != 1 {
			errs = append(errs, fmt.Errorf("order %s charged %d times", id, n))
		}
	}
	for id := range o.ledger {
		if !slices.Contains(o.sent.orders, id) {
			errs = append(errs, fmt.Errorf("the ledger charged %s, an order never sent", id))
		}
	}
	m := o.metrics.deliveries
	if int(m["processed"]) != len(o.sent.orders) {
		errs = append(errs, fmt.Errorf("/metrics counts %v processed deliveries for %d orders", m["processed"], len(o.sent.orders)))
	}
	if int(m["duplicate"]) < o.sent.twice {
		errs = append(errs, fmt.Errorf("/metrics counts %v duplicates for %d orders sent twice", m["duplicate"], o.sent.twice))
	}
	if m["handler_failed"] < 1 {
		errs = append(errs, errors.New("the flaky order's payment never failed a delivery"))
	}
	if m["in_progress"] < 1 {
		errs = append(errs, errors.New("no delivery found its order held elsewhere and was nacked in progress"))
	}
	if !slices.Equal(o.poisoned, []string{o.sent.malformed}) {
		errs = append(errs, fmt.Errorf("the poison queue holds %v, not just the message without an order id (%s)", o.poisoned, o.sent.malformed))
	}
	if int(o.metrics.executions) < o.sent.published {
		errs = append(errs, fmt.Errorf("/metrics counts %v handler runs for %d messages", o.metrics.executions, o.sent.published))
	}
	return errors.Join(errs...)
}

// claims states what check verified.
func (o observations) claims() string {
	m := o.metrics.deliveries
	return fmt.Sprintf("%s charged exactly once each in the ledger, under fencing tokens; %s dropped as duplicates, uncharged; "+
		"the flaky order charged after %s; %s nacked while %s order was held elsewhere, none charged again or poisoned; "+
		"only the message without an order id reached the poison queue; /metrics agrees with the ledger.",
		count(len(o.sent.orders), "order"), count(int(m["duplicate"]), "copy"), count(int(m["handler_failed"]), "failed delivery"),
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
		deliveries: sum(families["watermill_idempotency_deliveries_total"], "watermill_idempotency_outcome"),
		waited:     sum(families["watermill_idempotency_wait_duration_seconds"], "")[""],
		executions: sum(families["handler_execution_time_seconds"], "")[""],
	}, nil
}

// sum adds up a counter's samples, or a histogram's counts, by the value
// of label.
func sum(f *dto.MetricFamily, label string) map[string]float64 {
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
