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
	for i := range demoOrders {
		payload, err := json.Marshal(order{ID: fmt.Sprintf("order-%03d", i+1), AmountCents: int64(100 * (i + 1))})
		if err != nil {
			return err
		}
		for range 2 {
			if err := pub.Publish(d.names.orders, message.NewMessage(watermill.NewUUID(), payload)); err != nil {
				return err
			}
		}
	}
	d.logger.Info("sent", "orders", demoOrders, "messages", 2*demoOrders)
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
// receipts stream, and returns an error if a claim is false.
func (d *demo) verdict(ctx context.Context, pool *pgxpool.Pool) error {
	defer d.client.Close() // once more if a read failed; closed before the verdict is printed
	d.mu.Lock()
	err := d.err
	applied := d.applied
	d.mu.Unlock()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}

	charges := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT order_id, count(*) FROM `+d.names.charges+` GROUP BY order_id`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return err
		}
		charges[id] = n
	}
	if err := rows.Err(); err != nil {
		return err
	}
	outbox := map[string]int{}
	rows, err = pool.Query(ctx, `SELECT payload::text FROM "watermill_`+d.names.outbox+`"`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var payload string
		if err := rows.Scan(&payload); err != nil {
			return err
		}
		var envelope struct {
			UUID string `json:"uuid"`
		}
		if err := json.Unmarshal([]byte(payload), &envelope); err != nil {
			return err
		}
		outbox[envelope.UUID]++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	published := map[string]int{}
	entries, err := d.client.XRange(ctx, d.names.receipts, "-", "+").Result()
	if err != nil {
		return err
	}
	for _, e := range entries {
		if id, ok := e.Values["_watermill_message_uuid"].(string); ok {
			published[id]++
		}
	}

	var wrong []string
	claim := func(ok bool, what string) {
		if !ok {
			wrong = append(wrong, what)
		}
	}
	once := func(m map[string]int) bool {
		if len(m) != demoOrders {
			return false
		}
		for _, n := range m {
			if n != 1 {
				return false
			}
		}
		return true
	}
	claim(once(charges), "every order charged exactly once")
	claim(once(outbox), "every receipt in the outbox exactly once")
	claim(once(published), "every receipt published once, the duplicates publishing nothing")
	claim(once(applied), "every receipt applied downstream once")
	for i := range demoOrders {
		id := fmt.Sprintf("order-%03d", i+1)
		claim(charges[id] == 1 && outbox["receipt-"+id] == 1, "order "+id+" charged with its receipt")
	}

	_ = d.client.Close()
	fmt.Printf("Summary: %d orders sent %d times; %d charge rows, %d receipts in the outbox, %d in the receipts stream, %d applied downstream\n",
		demoOrders, 2*demoOrders, sum(charges), sum(outbox), len(entries), sum(applied))
	if len(wrong) > 0 {
		fmt.Printf("Check FAILED: not true that %s\n", strings.Join(wrong, "; "))
		return errors.New("a claim is false")
	}
	fmt.Printf("Check: %d orders charged exactly once each, each receipt in the outbox once, published once and applied once downstream\n", demoOrders)
	return nil
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
