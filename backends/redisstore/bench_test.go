package redisstore_test

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

// BenchmarkCalls measures the store's calls one after another on one
// caller, each cycle on a fresh key, against the shared Redis ($REDIS_ADDR):
// the scripts that run on every delivery (renew.lua, complete.lua,
// release.lua), acquire.lua (a released key taken again) and inspect.lua.
// Besides the time per cycle it reports the server's own time per cycle,
// srv-µs/op (INFO commandstats, every command), which a round trip's
// noise does not blur: what a change to a script costs the server.
func BenchmarkCalls(b *testing.B) {
	ctx := context.Background()
	client := testserver.RedisClient(b)
	s, err := redisstore.New(client, redisstore.Options{Prefix: testserver.Unique("redisstore-bench:")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	const owner = "bench-owner"
	acquire := func(b *testing.B, key string) backends.Lease {
		res, err := s.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: time.Minute,
			Retention: time.Minute, Fingerprint: []byte("fp"), Origin: "bench"})
		if err != nil || res.Status != backends.StatusAcquired {
			b.Fatal(res.Status, err)
		}
		return res.Lease
	}
	check := func(b *testing.B, err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	cycles := []struct {
		name string
		run  func(b *testing.B, key string)
	}{
		{"acquire+renew+complete", func(b *testing.B, key string) {
			l := acquire(b, key)
			check(b, s.Renew(ctx, l, time.Minute))
			check(b, s.Complete(ctx, l, []byte("output")))
		}},
		{"acquire+release+acquire+complete", func(b *testing.B, key string) {
			check(b, s.Release(ctx, acquire(b, key)))
			check(b, s.Complete(ctx, acquire(b, key), nil))
		}},
		{"inspect", func(b *testing.B, key string) {
			_, err := s.Inspect(ctx, "completed")
			check(b, err)
		}},
	}
	check(b, s.Complete(ctx, acquire(b, "completed"), []byte("output")))
	for _, c := range cycles {
		b.Run("cycle="+c.name, func(b *testing.B) {
			base := testserver.Unique(c.name) // the benchmark runs again with a larger b.N
			before := serverUsec(b, client)
			b.ResetTimer()
			for i := range b.N {
				c.run(b, base+strconv.Itoa(i))
			}
			b.StopTimer()
			b.ReportMetric(float64(serverUsec(b, client)-before)/float64(b.N), "srv-µs/op")
		})
	}
}

// BenchmarkCount measures Count over 300 records, a third each in
// progress, released and completed, in a database of their own (SCAN
// walks every key of it), on the Redis at $REDIS_ADDR.
func BenchmarkCount(b *testing.B) {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: testserver.RedisClient(b).Options().Addr, DB: 9})
	b.Cleanup(func() { _ = client.Close() })
	prefix := testserver.Unique("redisstore-bench:")
	s, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = s.Close()
		keys, _ := client.Keys(context.Background(), prefix+"*").Result()
		if len(keys) > 0 {
			_ = client.Del(context.Background(), keys...).Err()
		}
	})
	for i := range 300 {
		res, err := s.Acquire(ctx, backends.AcquireRequest{Key: "ns:" + strconv.Itoa(i), Owner: "bench-owner",
			LeaseTTL: time.Minute, Retention: time.Minute, Origin: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		switch i % 3 {
		case 1:
			err = s.Release(ctx, res.Lease)
		case 2:
			err = s.Complete(ctx, res.Lease, []byte("output"))
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	before := serverUsec(b, client)
	b.ResetTimer()
	for range b.N {
		c, err := s.Count(ctx, "ns")
		if err != nil || c.InProgress != 100 || c.OldestInProgress.IsZero() {
			b.Fatal(c, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(serverUsec(b, client)-before)/float64(b.N), "srv-µs/op")
}

// serverUsec is the time the server has spent running commands, µs, by
// INFO commandstats.
func serverUsec(b *testing.B, c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		_, stats, ok := strings.Cut(sc.Text(), ":")
		if !ok || !strings.HasPrefix(sc.Text(), "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(stats, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				total += n
			}
		}
	}
	return total
}
