package middleware

import (
	"context"
	"testing"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
)

// BenchmarkStoreCallContext measures what deadlineCtx saves: one store
// call (an Inspect of a key that does not exist, the smallest call) under
// the context the middleware gives each store call, deadlineCtx or
// context.WithTimeout, on memstore, Redis and Postgres (private servers
// under make test, or REDIS_ADDR and TEST_DATABASE_URL).
func BenchmarkStoreCallContext(b *testing.B) {
	ctx := context.Background()
	mem, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	rs, err := redisstore.New(testserver.RedisClient(b), redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	pool := testserver.PostgresPool(b)
	table := testserver.Unique("deadline_bench")
	ps, err := pgstore.New(pool, pgstore.Options{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	if err := ps.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	stores := []struct {
		name  string
		store backends.Store
	}{{"memstore", mem}, {"redis", rs}, {"postgres", ps}}
	kinds := []struct {
		name string
		make func(parent context.Context) (context.Context, func())
	}{
		{"deadlineCtx", func(parent context.Context) (context.Context, func()) {
			c := withDeadline(parent, DefaultStoreTimeout)
			return c, c.stop
		}},
		{"WithTimeout", func(parent context.Context) (context.Context, func()) {
			return context.WithTimeout(parent, DefaultStoreTimeout)
		}},
	}
	base := context.WithoutCancel(ctx) // as a delivery's: never cancelled
	key := testserver.Unique("absent")
	for _, s := range stores {
		for _, k := range kinds {
			b.Run("store="+s.name+"/ctx="+k.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					c, stop := k.make(base)
					if _, err := s.store.Inspect(c, key); err != backends.ErrNotFound {
						b.Fatalf("Inspect: %v", err)
					}
					stop()
				}
			})
		}
	}
}
