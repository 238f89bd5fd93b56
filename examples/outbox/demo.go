package main

// The demonstration, apart from the service: a producer that sends every
// order twice (a producer's retry, under a new message UUID), a downstream
// consumer of the receipts with the idempotency middleware keyed by message
// UUID, and a check of what happened. The check reads what an operator
// can see: the charges and outbox tables and the receipts stream. Every
// claim it prints is computed from them; the program exits non-zero if one
// is false.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// demoOrders is how many orders the demo sends, each twice.
const demoOrders = 20

type demo struct {
	logger *slog.Logger
	client *redis.Client
	names  names
	stop   context.CancelFunc

	mu      sync.Mutex
	applied map[string]int // receipts applied downstream, by UUID
	err     error          // the producer's or the downstream consumer's
	// Set by the producer: the orders it sent, once each, and the
	// messages.
	orders, published int
}

// startDemo starts the downstream consumer and, once running is closed,
// the producer; the context it returns ends once every order is settled
// and every receipt applied downstream.
func startDemo(ctx context.Context, cfg config, running <-chan struct{}, logger *slog.Logger) (*demo, context.Context, error) {
	runCtx, stop := context.WithCancel(ctx)
	d := &demo{
		logger:  logger,
		client:  redis.NewClient(&redis.Options{Addr: cfg.redisAddr, ContextTimeoutEnabled: true}),
		names:   namesFor(cfg.prefix),
		stop:    stop,
		applied: map[string]int{},
	}
	downstream, err := d.downstream()
	if err != nil {
		stop()
		return nil, nil, err
	}
	go func() {
		defer stop()
		down := make(chan error, 1)
		go func() { down <- downstream.Run(runCtx) }()
		err := d.produce(runCtx, running)
		if err == nil {
			err = d.settle(runCtx)
		}
		stop()
		err = errors.Join(err, <-down)
		d.mu.Lock()
		d.err = err
		d.mu.Unlock()
	}()
	return d, runCtx, nil
}

// downstream is the receipts' consumer, as another service would run it:
// the middleware keyed by message UUID, in front of a handler that
// applies a receipt.
func (d *demo) downstream() (*message.Router, error) {
	logger := watermill.NopLogger{}
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:        redis.NewClient(&redis.Options{Addr: d.client.Options().Addr, ContextTimeoutEnabled: true}), // closed by the subscriber
		ConsumerGroup: d.names.receipts + "-shipping", OldestId: "0",
		DisableIndefiniteInitialBlock: true, BlockTime: 100 * time.Millisecond,
	}, logger)
	if err != nil {
		return nil, err
	}
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		return nil, err
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Key: keyfunc.UUID(), Namespace: "ship"})
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return nil, err
	}
	h := router.AddConsumerHandler("ship", d.names.receipts, sub, func(msg *message.Message) error {
		d.mu.Lock()
		d.applied[msg.UUID]++
		d.mu.Unlock()
		return nil
	})
	h.AddMiddleware(idem.Middleware)
	return router, nil
}

// produce sends every order twice, under two message UUIDs.
func (d *demo) produce(ctx context.Context, running <-chan struct{}) error {
	select {
	case <-running:
	case <-ctx.Done():
		return ctx.Err()
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: d.client}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	var orders, published int
	for i := range demoOrders {
		payload, err := json.Marshal(order{ID: fmt.Sprintf("order-%03d", i+1), AmountCents: int64(100 * (i + 1))})
		if err != nil {
			return err
		}
		for range 2 {
			if err := pub.Publish(d.names.orders, message.NewMessage(watermill.NewUUID(), payload)); err != nil {
				return err
			}
			published++
		}
		orders++
	}
	d.mu.Lock()
	d.orders, d.published = orders, published
	d.mu.Unlock()
	d.logger.Info("sent", "orders", orders, "messages", published)
	return nil
}

// settle waits until every order message is acked and every receipt
// applied downstream, then a second more, for a duplicate that would
// publish a receipt again to show itself.
func (d *demo) settle(ctx context.Context) error {
	for {
		d.mu.Lock()
		applied := len(d.applied)
		d.mu.Unlock()
		groups, err := d.client.XInfoGroups(ctx, d.names.orders).Result()
		if err != nil {
			return err
		}
		acked := false
		for _, g := range groups {
			acked = acked || g.Name == d.names.group && g.Pending == 0 && g.Lag == 0 && g.EntriesRead == 2*demoOrders
		}
		if acked && applied == demoOrders {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Second):
	}
	return nil
}

// verdict prints what happened, computed from the tables and the
// streams, and returns an error if a claim is false.
func (d *demo) verdict(ctx context.Context, pool *pgxpool.Pool) error {
	defer d.client.Close() // once more if a read failed; closed before the verdict is printed
	d.mu.Lock()
	err := d.err
	obs := observations{orders: d.orders, sent: d.published, applied: d.applied}
	d.mu.Unlock()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}

	if obs.charges, err = countBy(ctx, pool, `SELECT order_id, count(*) FROM `+d.names.charges+` GROUP BY order_id`); err != nil {
		return err
	}
	if obs.outbox, err = countBy(ctx, pool, `SELECT payload::json->>'uuid', count(*) FROM "watermill_`+d.names.outbox+`" GROUP BY 1`); err != nil {
		return err
	}
	if obs.onOrders, err = d.client.XLen(ctx, d.names.orders).Result(); err != nil {
		return err
	}
	entries, err := d.client.XRange(ctx, d.names.receipts, "-", "+").Result()
	if err != nil {
		return err
	}
	obs.published = map[string]int{}
	for _, e := range entries {
		id, _ := e.Values["_watermill_message_uuid"].(string)
		obs.published[id]++
	}
	_ = d.client.Close()

	fmt.Println("Summary:")
	for _, line := range obs.sums() {
		fmt.Println(line)
	}
	if err := obs.check(); err != nil {
		fmt.Printf("Check FAILED: %v\n", err)
		return err
	}
	fmt.Printf("Check: %d orders charged exactly once each, each receipt in the outbox once, published once and applied once downstream; every sum above adds up.\n", obs.orders)
	return nil
}

// countBy runs query, which returns a key and a count per row, and
// returns the counts by key.
func countBy(ctx context.Context, pool *pgxpool.Pool, query string) (map[string]int, error) {
	rows, err := pool.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for rows.Next() {
		var key string
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			return nil, err
		}
		out[key] = n
	}
	return out, rows.Err()
}

// observations is what the check reads: what the producer sent, the
// charges and outbox tables, the streams, and the downstream consumer.
type observations struct {
	orders, sent int   // the orders sent, once each, and the messages sent
	onOrders     int64 // the orders stream's entries (XLEN)
	charges      map[string]int
	outbox       map[string]int // receipts in the outbox table, by UUID
	published    map[string]int // receipts on the receipts stream, by UUID
	applied      map[string]int // receipts applied downstream, by UUID
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

// once splits counts by key into the total, the keys counted, and the
// counts beyond the first of each key.
func once(m map[string]int) (total, keys, again int) {
	for _, n := range m {
		total += n
		if n > 0 {
			keys++
			again += n - 1
		}
	}
	return total, keys, again
}

// sums are the lines of the summary.
func (o observations) sums() []sum {
	line := func(label string, m map[string]int, first, again string) sum {
		total, keys, more := once(m)
		return sum{label: label, total: total, parts: []part{{keys, first}, {more, again}}}
	}
	return []sum{
		{label: "messages on the orders stream (XLEN)", total: int(o.onOrders), parts: []part{
			{o.orders, "orders, a first copy of each"}, {o.sent - o.orders, "second copies, as a producer's retry sends them"}}},
		line("charge rows", o.charges, "orders charged", "charges of an order charged before"),
		line("receipts in the outbox table", o.outbox, "receipts", "written again"),
		line("receipts on the receipts stream", o.published, "receipts", "published again"),
		line("receipts applied downstream", o.applied, "receipts", "applied again"),
	}
}

// check returns every claim that is false.
func (o observations) check() error {
	var errs []error
	for _, s := range o.sums() {
		if err := s.check(); err != nil {
			errs = append(errs, err)
		}
	}
	if int(o.onOrders) != o.sent {
		errs = append(errs, fmt.Errorf("the orders stream holds %d messages; %d were sent", o.onOrders, o.sent))
	}
	for what, m := range map[string]map[string]int{
		"charged": o.charges, "in the outbox": o.outbox, "published": o.published, "applied downstream": o.applied,
	} {
		if total, keys, _ := once(m); total != o.orders || keys != o.orders {
			errs = append(errs, fmt.Errorf("%d of %d orders %s, %d times in all, not once each", keys, o.orders, what, total))
		}
	}
	for i := range o.orders {
		id := fmt.Sprintf("order-%03d", i+1)
		if o.charges[id] != 1 || o.outbox["receipt-"+id] != 1 {
			errs = append(errs, fmt.Errorf("order %s: %d charges, %d receipts in the outbox", id, o.charges[id], o.outbox["receipt-"+id]))
		}
	}
	return errors.Join(errs...)
}
