package main

// The demonstration, apart from the service: a producer that sends what
// producers really send, a second copy of the service that joins the
// consumer group while an order is being charged, as a deploy or a
// scale-out does, and a check of what happened. The check reads only what
// an operator can see: the ledger, the lease store, Kafka (the poison
// topic, the consumer group's members and committed offsets) and the two
// copies' /metrics. Every claim it prints is computed from them; the
// program exits non-zero if one is false.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
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

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
)

// demoOrders is how many ordinary orders the demo sends, each twice.
const demoOrders = 20

// The orders with a story.
const (
	slowOrder  = "order-slow"  // its payment takes slowCharge; a second copy of the service joins meanwhile
	flakyOrder = "order-flaky" // its payment fails three times
)

// partitionMetadata names the partition the demo's producer puts a message
// on: each copy of an order on its own partition, so that the copies are
// handled at once (a consumer handles one message per partition at a
// time).
const partitionMetadata = "demo_partition"

type demo struct {
	logger     *slog.Logger
	cfg        config // the service's, for its second copy
	brokers    []string
	redis      *redis.Client
	leases     *redisstore.Store // read only: is the slow order being charged?
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
	err           error
	orders        []string // every order sent, once each
	orderMessages int      // messages sent that carry an order
	published     int      // messages sent
	malformed     string   // the UUID of the message without an order id
	scaleOut      scaleOut
	second        scraped // the second copy's /metrics, once every message was settled
}

// scaleOut is what the demo saw of the second copy joining the group while
// the slow order ran.
type scaleOut struct {
	// first is the group's members when the slow order's charge began:
	// the first copy's.
	first []string
	// evicted is set if the group, looked at while the slow order was not
	// yet charged, had members and none of first: the first copy, busy in
	// its handler, missed the rebalance the second copy's joining started.
	evicted bool
	// readAgain counts the deliveries on the second copy's /metrics, once
	// the slow order was settled, that found the order held and waited;
	// nacked, those of them nacked in progress. Only the slow order's two
	// messages were on the topic, both delivered to the first copy
	// already: the second copy read them again, from the last committed
	// offsets.
	readAgain, nacked int
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
	leases, err := redisstore.New(rdb, redisstore.Options{Prefix: cfg.prefix + "idem:"})
	if err != nil {
		_ = pub.Close()
		_ = client.Close()
		_ = rdb.Close()
		return nil, nil, err
	}
	d := &demo{
		logger:     logger,
		cfg:        cfg,
		brokers:    brokers,
		redis:      rdb,
		leases:     leases,
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
func (d *demo) produce(ctx context.Context) (err error) {
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
			d.orderMessages++
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
	second, err := d.scaleOutWhileSlow(ctx)
	if second != nil {
		// The second copy shuts down gracefully before the first, as
		// SIGTERM would shut it down.
		defer func() {
			if stopErr := second.stop(); stopErr != nil && err == nil {
				err = fmt.Errorf("the second copy of the service: %w", stopErr)
			}
		}()
	}
	if err != nil {
		return err
	}

	d.logger.Info("demo: sending the flaky order, a message without an order id, and every other order twice")
	if err := send(order{ID: flakyOrder, AmountCents: 700, Simulate: "flaky"}, 1); err != nil {
		return err
	}
	if d.malformed, err = publish([]byte(`{"amount_cents":100}`), 0); err != nil {
		return err
	}
	for i := range demoOrders {
		if err := send(order{ID: fmt.Sprintf("order-%03d", i+1), AmountCents: int64(1000 + i)}, 2); err != nil {
			return err
		}
	}
	if err := d.waitSettled(ctx, second); err != nil {
		return err
	}
	// The second copy's /metrics goes with it: read it now.
	if d.second, err = scrape(ctx, second.metricsURL); err != nil {
		return fmt.Errorf("the second copy of the service: %w", err)
	}
	d.logger.Info("demo: every message settled; stopping the second copy")
	return nil
}

// scaleOutWhileSlow starts a second copy of the service once the slow
// order is being charged, as a deploy or a scale-out would start one, and
// returns it once the slow order is settled.
//
// The second copy joins the consumer group, and the group rebalances.
// Sarama rejoins only once every running handler has returned, so the
// first copy, busy charging the slow order (and its copy busy waiting for
// it), misses the rebalance and is evicted after rebalanceTimeout. Its
// partitions go to the second copy, which reads them again from the last
// committed offsets: the slow order's messages, while the first copy still
// charges it. The middleware makes those deliveries wait for the holder
// and nacks them while the order is in progress; once it is charged, they
// are acked as duplicates, and their acks commit the offsets that the
// first copy's, from a member no longer in the group, could not.
func (d *demo) scaleOutWhileSlow(ctx context.Context) (*instance, error) {
	// Being charged: its lease is held, as `idem inspect` shows it.
	for {
		rec, err := d.leases.Inspect(ctx, "charge-order:"+slowOrder)
		if err == nil && rec.State == backends.StateInProgress {
			break
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			return nil, fmt.Errorf("the slow order was not being charged: %w", err)
		}
	}
	for len(d.scaleOut.first) == 0 {
		_, d.scaleOut.first, _ = d.members()
		if len(d.scaleOut.first) == 0 {
			if err := pause(ctx, 20*time.Millisecond); err != nil {
				return nil, fmt.Errorf("the consumer group has no member while the slow order is charged: %w", err)
			}
		}
	}
	d.logger.Info("demo: the slow order is being charged; a second copy of the service joins the consumer group",
		"members", len(d.scaleOut.first))
	second, err := startCopy(ctx, d.cfg, d.brokers)
	if err != nil {
		return nil, err
	}
	for {
		if e, err := d.ledger.entries(ctx); err == nil && e[slowOrder].Charges > 0 {
			break
		}
		if _, m, err := d.members(); err == nil && len(m) > 0 && !slices.ContainsFunc(m, func(id string) bool { return slices.Contains(d.scaleOut.first, id) }) {
			d.scaleOut.evicted = true
		}
		if err := second.exited(); err != nil {
			return second, err
		}
		if err := pause(ctx, 50*time.Millisecond); err != nil {
			return second, fmt.Errorf("the slow order was not charged: %w", err)
		}
	}
	if err := d.waitSettled(ctx, second); err != nil {
		return second, err
	}
	// The first copy rejoins once its handlers have returned. The rest of
	// the orders go once the group is stable again, both copies in it,
	// so that they meet no rebalance of this one's making.
	for {
		state, m, err := d.members()
		if err == nil && state == "Stable" && len(m) == 2 {
			break
		}
		if err := second.exited(); err != nil {
			return second, err
		}
		if err := pause(ctx, 50*time.Millisecond); err != nil {
			return second, fmt.Errorf("the consumer group is not stable with both copies in it (%s, %d members): %w", state, len(m), err)
		}
	}
	m, err := scrape(ctx, second.metricsURL)
	if err != nil {
		return second, fmt.Errorf("the second copy of the service: %w", err)
	}
	// Every delivery that found the order held waited for the holder (the
	// wait histogram counts it), then saw it charged or gave up and was
	// nacked in progress.
	d.scaleOut.readAgain = max(int(m.waited), int(m.deliveries["in_progress"]))
	d.scaleOut.nacked = int(m.deliveries["in_progress"])
	return second, nil
}

// members returns the consumer group's state (Stable, PreparingRebalance,
// ...) and the ids of its members.
func (d *demo) members() (string, []string, error) {
	groups, err := d.admin.DescribeConsumerGroups([]string{d.group})
	if err != nil {
		return "", nil, err
	}
	if len(groups) != 1 {
		return "", nil, fmt.Errorf("describing group %s: %d groups", d.group, len(groups))
	}
	if groups[0].Err != sarama.ErrNoError {
		return "", nil, groups[0].Err
	}
	return groups[0].State, slices.Sorted(maps.Keys(groups[0].Members)), nil
}

// waitSettled returns once every order sent is charged, and the consumer
// group's offsets are committed up to the end of every partition.
func (d *demo) waitSettled(ctx context.Context, second *instance) error {
	for {
		charged, drained, err := d.settled(ctx)
		if err == nil && charged == len(d.orders) && drained {
			return nil
		}
		if err := second.exited(); err != nil {
			return err
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

// instance is a second copy of the service, in this process: run, the
// service's own entry point, as -serve runs it, on the same Kafka, Redis
// and PREFIX as the first, with /metrics on a port of its own. Its log
// lines are among the first copy's.
type instance struct {
	metricsURL string
	cancel     context.CancelFunc
	done       chan error
	stopped    bool
	err        error
}

func startCopy(ctx context.Context, cfg config, brokers []string) (*instance, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cfg.brokers = strings.Join(brokers, ",") // the Kafka in process too, if it is that
	cfg.metricsAddr = addr
	ctx, cancel := context.WithCancel(ctx)
	c := &instance{metricsURL: "http://" + addr + "/metrics", cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- run(ctx, cfg, false) }()
	return c, nil
}

// freeAddr returns a local address that nothing listens on: the second
// copy's /metrics.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// exited returns an error if the copy has stopped on its own.
func (c *instance) exited() error {
	if c == nil || c.stopped {
		return nil
	}
	select {
	case err := <-c.done:
		c.stopped, c.err = true, err
		if err == nil {
			err = errors.New("stopped")
		}
		return fmt.Errorf("the second copy of the service: %w", err)
	default:
		return nil
	}
}

// stop shuts the copy down gracefully, as SIGTERM would, and returns the
// error it stopped with.
func (c *instance) stop() error {
	if !c.stopped {
		c.cancel()
		c.stopped, c.err = true, <-c.done
	}
	return c.err
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
	defer d.leases.Close()
	defer d.kafka.Close()
	defer d.pub.Close()
	if d.err != nil {
		fmt.Printf("Check FAILED: %v\n", d.err)
		return d.err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	obs := observations{
		orders: d.orders, orderMessages: d.orderMessages, published: d.published, malformed: d.malformed,
		scaleOut: d.scaleOut,
	}
	var err error
	if obs.ledger, err = d.ledger.entries(ctx); err != nil {
		return err
	}
	ends, err := d.ends(d.topic)
	if err != nil {
		return err
	}
	for _, end := range ends {
		obs.onTopic += int(end)
	}
	if obs.poisoned, err = d.poisoned(); err != nil {
		return err
	}
	first, err := scrape(ctx, d.metricsURL)
	if err != nil {
		return err
	}
	obs.metrics = first.plus(d.second)

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
// the ledger, Kafka and the two copies' /metrics hold.
type observations struct {
	// Sent: the orders (once each), the messages that carry one, every
	// message, and the UUID of the one without an order id.
	orders        []string
	orderMessages int
	published     int
	malformed     string

	ledger   map[string]entry
	onTopic  int      // the orders topic's messages: its partitions' end offsets, added up
	poisoned []string // the poison topic's message UUIDs
	metrics  scraped  // both copies' /metrics, added up
	scaleOut scaleOut
}

// scraped is what /metrics said.
type scraped struct {
	deliveries map[string]float64 // the middleware's deliveries by outcome
	waited     float64            // deliveries that waited for the key's holder
	executions float64            // Watermill's count of the router's handler runs: deliveries
	attempts   map[string]float64 // the handler's charge attempts by result
}

// plus adds up two copies' /metrics.
func (s scraped) plus(o scraped) scraped {
	out := scraped{deliveries: map[string]float64{}, waited: s.waited + o.waited, executions: s.executions + o.executions, attempts: map[string]float64{}}
	for _, m := range []scraped{s, o} {
		for k, v := range m.deliveries {
			out.deliveries[k] += v
		}
		for k, v := range m.attempts {
			out.attempts[k] += v
		}
	}
	return out
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
		{label: "messages on the orders topic (its partitions' end offsets)", total: o.onTopic, parts: []part{
			{len(o.orders), "orders, a first copy of each"},
			{o.orderMessages - len(o.orders), "second copies, on the other partition, as a producer's retry sends them"},
			{o.published - o.orderMessages, "without an order id"}}},
		{label: "deliveries to the routers of both copies (handler_execution_time_seconds_count)", total: int(m.executions), parts: []part{
			{o.onTopic, "messages, each delivered once"},
			{int(m.executions) - o.onTopic, "delivered again: retried in place after a nack, or read again after a rebalance"}}},
		{label: "the same deliveries by outcome (the middleware's count)", total: int(m.executions), parts: o.outcomes()},
		{label: "charge attempts (orders_charge_attempts_total)", total: int(m.attempts["charged"] + m.attempts["failed"]), parts: []part{
			{charges, "charges in the ledger"}, {int(m.attempts["failed"]), "failed"}}},
		{label: "charges in the ledger", total: charges, parts: []part{
			{charged, "orders charged"}, {again, "charges of an order charged before"}}},
		// Kafka may deliver the message without an order id again after a
		// rebalance, before its offset is committed: each delivery is
		// forwarded, so the poison topic may hold it more than once.
		{label: "messages on the poison topic", total: len(o.poisoned), parts: []part{
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
	if o.onTopic != o.published {
		errs = append(errs, fmt.Errorf("the orders topic holds %d messages; %d were sent", o.onTopic, o.published))
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
	if again, nacked := int(o.metrics.executions)-o.onTopic, int(m["handler_failed"]+m["in_progress"]); again < nacked {
		errs = append(errs, fmt.Errorf("%d deliveries beyond one per message, for %d nacks", again, nacked))
	}
	if m["in_progress"] < 1 {
		errs = append(errs, errors.New("no copy of an order gave up waiting while the order ran"))
	}
	if !o.scaleOut.evicted {
		errs = append(errs, errors.New("the first copy was never seen evicted from the consumer group while it charged the slow order"))
	}
	if o.scaleOut.readAgain < 1 {
		errs = append(errs, errors.New("the second copy never read the slow order's messages again while the first copy charged it"))
	}
	if len(o.poisoned) == 0 || slices.ContainsFunc(o.poisoned, func(uuid string) bool { return uuid != o.malformed }) {
		errs = append(errs, fmt.Errorf("the poison topic holds %v, not the message without an order id (%s) alone", o.poisoned, o.malformed))
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
	poisoned := ""
	if n := len(o.poisoned); n > 1 {
		poisoned = fmt.Sprintf(" (%s of it: Kafka delivered it %s, and each delivery was forwarded)", count(n, "copy"), count(int(m["key_error"]), "time"))
	}
	return fmt.Sprintf("%s charged exactly once each in the ledger, under fencing tokens; "+
		"the %s and %s of charged orders dropped as duplicates, uncharged; "+
		"the flaky order charged after %s in %s; "+
		"while the slow order ran, a second copy of the service joined the consumer group: the first copy, busy charging it, was evicted, "+
		"and the second read the slow order's messages again from the last committed offsets (%s found the order held and waited, %d of them nacked in progress); "+
		"in all, %s found %s order held on the other partition or by the other copy and waited "+
		"(%d of them then nacked in progress and retried in place), none charged again or poisoned; "+
		"only the message without an order id reached the poison topic%s; every sum above adds up.",
		count(len(o.orders), "order"), count(second, "second copy"), count(int(m["duplicate"])-second, "other delivery"),
		count(int(o.metrics.attempts["failed"]), "failed payment"), count(int(m["handler_failed"]), "failed delivery"),
		count(o.scaleOut.readAgain, "delivery"), o.scaleOut.nacked,
		count(inFlight, "delivery"), plural(inFlight, "its", "their"), int(m["in_progress"]), poisoned)
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
