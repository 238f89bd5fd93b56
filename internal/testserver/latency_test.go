package testserver

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Every command through the proxy arrives at least its latency late, in
// order, and the proxy stops with the test.
func TestLatencyProxy(t *testing.T) {
	const latency = 50 * time.Millisecond
	direct := RedisClient(t)
	addr := StartLatencyProxy(t, direct.Options().Addr, latency)
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	key := Unique("latency-proxy:")
	t.Cleanup(func() { direct.Del(context.Background(), key) })
	for i := range 3 {
		start := time.Now()
		if err := c.RPush(ctx, key, i).Err(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < latency {
			t.Fatalf("a command through the proxy took %v, less than its %v latency", d, latency)
		}
	}
	got, err := c.LRange(ctx, key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != "0" || got[2] != "2" {
		t.Fatalf("commands out of order or lost: %v", got)
	}
}
