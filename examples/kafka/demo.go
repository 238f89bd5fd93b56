package main

// The demonstration, apart from the service: a producer that sends what
// producers really send, and a check of what happened. The check reads
// only what an operator can see: the ledger, Kafka (the poison topic, the
// consumer group's committed offsets) and /metrics. Every claim it prints
// is computed from them; the program exits non-zero if one is false.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
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

// partitionMetadata names the partition the demo's producer puts a message
// on: each copy of an order on its own partition, so that the copies are
// handled at once (a consumer handles one message per partition at a
// time).
const partitionMetadata = "demo_partition"

type demo struct {
	logger     *slog.Logger
	redis      *redis.Client
	kafka      sarama.Client
	admin      sarama.ClusterAdmin
	pub        message.Publisher
	ledger     *ledger
	metricsURL string
	topic      string
	group      string
	poison     string

	done chan struct{} // closed once produce has returned
	// Set by produce, read once done is closed.
	err       error
	orders    []string // every order sent
	published int      // messages sent
	twice     int      // orders sent twice, each copy on its own partition
	malformed string   // the UUID of the message without an order id
}

// startDemo starts producing once running is closed. The context it
// returns ends once every message is settled, or the demo failed: the
// service runs until then.
func startDemo(ctx context.Context, cfg config, brokers []string, running <-chan struct{}, metricsURL string, logger *slog.Logger) (*demo, context.Context, error) {
	pubCfg := kafka.DefaultSaramaSyncPublisherConfig()
	pubCfg.Producer.Partitioner = sarama.NewManualPartitioner
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: partitionMarshaler{}, OverwriteSaramaConfig: pubCfg}, watermill.NopLogger{})
	if err != nil {
		return nil, nil, err
	}
	client, err := sarama.NewClient(brokers, sarama.NewConfig())
	if err != nil {
		_ = pub.Close()
		return nil, nil, err
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		_ = pub.Close()
		_ = client.Close()
		return nil, nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: cfg.redisAddr, ContextTimeoutEnabled: true})
	d := &demo{
		logger:     logger,
		redis:      rdb,
		kafka:      client,
		admin:      admin,
		pub:        pub,
		ledger:     &ledger{client: rdb, prefix: cfg.prefix + "ledger:"},
		metricsURL: metricsURL,
		topic:      cfg.prefix + "orders",
		group:      cfg.prefix + "billing",
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

// partitionMarshaler puts a message on the partition its metadata names.
type partitionMarshaler struct{ kafka.DefaultMarshaler }

func (m partitionMarshaler) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	km, err := m.DefaultMarshaler.Marshal(topic, msg)
	if err != nil {
		return nil, err
	}
	p, _ := strconv.Atoi(msg.Metadata.Get(partitionMetadata))
	km.Partition = int32(p % partitions)
	return km, nil
}

// produce sends the demo's messages and returns once they are settled.
func (d *demo) produce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	publish := func(payload []byte, partition int) (string, error) {
		msg := message.NewMessage(watermill.NewUUID(), payload)
		msg.Metadata.Set(partitionMetadata, strconv.Itoa(partition))
		if err := d.pub.Publish(d.topic, msg); err != nil {
			return "", err
		}
		d.published++
		return msg.UUID, nil
	}
	// send sends an order once, or twice: a producer that retried a send
	// it thought had failed, each copy on its own partition.
	send := func(o order, copies int) error {
		payload, err := json.Marshal(o)
		if err != nil {
			return err
		}
		d.orders = append(d.orders, o.ID)
		for c := range copies {
			if _, err := publish(payload, c); err != nil {
				return err
			}
		}
		if copies > 1 {
			d.twice++
		}
		return nil
	}

	// The slow order, twice: while one copy's payment runs, the other
	// waits for it on the other partition, gives up after inProgressWait,
	// is nacked and retried in place until the order is charged.
	d.logger.Info("demo: sending the slow order twice, one copy on each partition")
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
	if d.malformed, err = publish([]byte(`{"amount_cents":100}`), 0); err != nil {
		return err
	}
	for i := range demoOrders {
		if err := send(order{ID: fmt.Sprintf("order-%03d", i+1), AmountCents: int64(1000 + i)}, 2); err != nil {
			return err
		}
	}

	// Settled: every order charged, and the consumer group's offsets
	// committed up to the end of every partition.
	for {
		charged, drained, err := d.settled(ctx)
		if err == nil && charged == len(d.orders) && drained {
			d.logger.Info("demo: every message settled")
			return nil
		}
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("not settled: %d of %d orders charged, offsets committed to the end: %v: %w", charged, len(d.orders), drained, err)
		}
	}
}

// settled reports how many orders are charged, and whether the consumer
// group has committed every partition's offset up to its end.
func (d *demo) settled(ctx context.Context) (charged int, drained bool, err error) {
	entries, err := d.ledger.entries(ctx)
	if err != nil {
		return 0, false, err
	}
	ends, err := d.ends(d.topic)
	if err != nil {
		return len(entries), false, err
	}
	committed, err := d.admin.ListConsumerGroupOffsets(d.group, map[string][]int32{d.topic: slices.Collect(maps.Keys(ends))})
	if err != nil {
		return len(entries), false, err
	}
	drained = true
	for p, end := range ends {
		block := committed.GetBlock(d.topic, p)
		if block == nil || block.Offset < end {
			drained = false
		}
	}
	return len(entries), drained, nil
}

// ends returns the offset after the last message of each of topic's
// partitions.
func (d *demo) ends(topic string) (map[int32]int64, error) {
	if err := d.kafka.RefreshMetadata(topic); err != nil {
		return nil, err
	}
	parts, err := d.kafka.Partitions(topic)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, p := range parts {
		if out[p], err = d.kafka.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// poisoned returns the UUIDs of the messages on the poison topic.
func (d *demo) poisoned() ([]string, error) {
	ends, err := d.ends(d.poison)
	if err != nil {
		return nil, err
	}
	consumer, err := sarama.NewConsumerFromClient(d.kafka)
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	var uuids []string
	for p, end := range ends {
		if end == 0 {
			continue
		}
		pc, err := consumer.ConsumePartition(d.poison, p, sarama.OffsetOldest)
		if err != nil {
			return nil, err
		}
		for msg := range pc.Messages() {
			for _, h := range msg.Headers {
				if string(h.Key) == kafka.UUIDHeaderKey {
					uuids = append(uuids, string(h.Value))
				}
			}
			if msg.Offset+1 >= end {
				break
			}
		}
		if err := pc.Close(); err != nil {
			return nil, err
		}
	}
	return uuids, nil
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
	defer d.kafka.Close()
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
	if obs.poisoned, err = d.poisoned(); err != nil {
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
	poisoned []string // the poison topic's message UUIDs
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
	return fmt.Sprintf("%d messages: %d orders (%d of them sent twice, a copy on each partition), 1 without an order id; /metrics: deliveries %s, %v waited for a holder, %v handler runs; ledger: %s; poison topic: %s",
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
		errs = append(errs, errors.New("the slow order's copy never gave up waiting while the order ran"))
	}
	if !slices.Equal(o.poisoned, []string{o.sent.malformed}) {
		errs = append(errs, fmt.Errorf("the poison topic holds %v, not just the message without an order id (%s)", o.poisoned, o.sent.malformed))
	}
	if int(o.metrics.executions) < o.sent.published {
		errs = append(errs, fmt.Errorf("/metrics counts %v handler runs for %d messages", o.metrics.executions, o.sent.published))
	}
	return errors.Join(errs...)
}

// claims states what check verified.
func (o observations) claims() string {
	m := o.metrics.deliveries
	// Every delivery that found its order held waited for the holder
	// (the wait histogram counts it), then either saw the order charged
	// or gave up and was nacked in progress.
	inFlight := max(int(o.metrics.waited), int(m["in_progress"]))
	return fmt.Sprintf("%s charged exactly once each in the ledger, under fencing tokens; %s dropped as duplicates, uncharged; "+
		"the flaky order charged after %s; %s found %s order held on the other partition and waited "+
		"(%d of them then nacked in progress and retried in place), none charged again or poisoned; "+
		"only the message without an order id reached the poison topic; /metrics agrees with the ledger.",
		count(len(o.sent.orders), "order"), count(int(m["duplicate"]), "copy"), count(int(m["handler_failed"]), "failed delivery"),
		count(inFlight, "delivery"), plural(inFlight, "its", "their"), int(m["in_progress"]))
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
