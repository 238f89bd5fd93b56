package middleware_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// BenchmarkReplay measures a replayed topic on Redis: 30,000 messages whose
// keys this process has completed, delivered again, with the completed-key
// cache off and on. One op is the whole replay; msgs/s and store-calls/op
// (Acquire calls; a duplicate makes no other) are reported.
func BenchmarkReplay(b *testing.B) {
	const n = 30000
	for _, on := range []bool{false, true} {
		b.Run("cache="+map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			rs, err := redisstore.New(testserver.RedisClient(b), redisstore.Options{Prefix: testserver.Unique("replay-bench") + ":"})
			if err != nil {
				b.Fatal(err)
			}
			store := &acquireCounter{Store: rs}
			cfg := middleware.Config{Store: store, Namespace: "bench"}
			if on {
				cfg.CompletedCache = middleware.CompletedCache{Size: n, TTL: time.Minute}
			}
			m, err := middleware.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			h := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
			payload := []byte(`{"order_id":"o-1"}`)
			msgs := make([]*message.Message, n)
			for i := range msgs {
				msgs[i] = message.NewMessage("r-"+strconv.Itoa(i), payload)
				if _, err := h(msgs[i]); err != nil {
					b.Fatal(err)
				}
			}
			calls := store.n.Load()
			start := time.Now()
			for b.Loop() {
				for _, msg := range msgs {
					if _, err := h(message.NewMessage(msg.UUID, payload)); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N)*n/time.Since(start).Seconds(), "msgs/s")
			b.ReportMetric(float64(store.n.Load()-calls)/float64(b.N), "store-calls/op")
		})
	}
}
