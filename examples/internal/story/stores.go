package story

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

// Store is a lease store a broker's story runs with.
type Store struct {
	Name string
	New  func(t testing.TB) backends.Store
}

// Stores are the stores every broker's story runs with: the real Redis
// and the real Postgres, each test's records apart.
var Stores = []Store{
	{"redis", func(t testing.TB) backends.Store {
		s, err := redisstore.New(testenv.RedisClient(t), redisstore.Options{Prefix: testenv.Unique("story-")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}},
	{"postgres", func(t testing.TB) backends.Store {
		pool := testenv.PostgresPool(t)
		schema := strings.NewReplacer("-", "_", ":", "").Replace(testenv.Unique("story_"))
		s, err := pgstore.New(pool, pgstore.Options{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
		t.Cleanup(func() { _ = s.Close() })
		return s
	}},
}

// Tell runs the story on the broker newBroker returns, once per store in
// Stores and then in extra, each in its own subtest, and fails the test
// if its check fails.
func Tell(t *testing.T, newBroker func(t *testing.T) Broker, extra ...Store) {
	for _, st := range append(slices.Clip(Stores), extra...) {
		t.Run(st.Name, func(t *testing.T) {
			b := newBroker(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out bytes.Buffer
			rep, err := Run(ctx, b, st.New(t), 20, &out)
			t.Log("\n" + out.String() + "Summary: " + rep.String())
			if err == nil {
				err = rep.Check()
			}
			if err != nil {
				t.Fatalf("story failed: %v\n%+v", err, rep)
			}
		})
	}
}
