package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// testConfig is a small run against the servers `make test` starts.
func testConfig(t *testing.T) config {
	t.Helper()
	cfg := defaultConfig()
	for _, v := range []struct {
		name string
		into *string
	}{{"REDIS_ADDR", &cfg.redisAddr}, {"TEST_DATABASE_URL", &cfg.pgURL}, {"MYSQL_DSN", &cfg.mysqlDSN}} {
		if *v.into = os.Getenv(v.name); *v.into == "" {
			t.Fatalf("%s is not set: run the tests with bin/testenv (docs/development.md)", v.name)
		}
	}
	cfg.messages = 500
	cfg.rounds = 2
	// Duplicates close to their originals, so that some find their key
	// in progress.
	cfg.spread = 10
	return cfg
}

// TestBenchmark runs every variant, small, and checks what it measured.
func TestBenchmark(t *testing.T) {
	cfg := testConfig(t)
	var out bytes.Buffer
	results, err := run(context.Background(), cfg, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if len(results) != len(variants) {
		t.Fatalf("%d results for %d variants", len(results), len(variants))
	}
	var waited int64
	for _, r := range results {
		if !strings.Contains(out.String(), "| "+r.variant.name+" ") {
			t.Errorf("the table has no row for %s", r.variant.name)
		}
		if len(r.runs) != cfg.rounds {
			t.Fatalf("%s: %d runs in %d rounds", r.variant.name, len(r.runs), cfg.rounds)
		}
		// The servers' CPU is counted in clock ticks of 10 ms: one small
		// run may take less than a tick, all of them together do not.
		var storeCPU time.Duration
		for i, m := range r.runs {
			if m.elapsed <= 0 || m.client <= 0 || m.redis <= 0 {
				t.Errorf("%s, round %d: elapsed %v, client CPU %v, Redis CPU %v: each must be positive", r.variant.name, i+1, m.elapsed, m.client, m.redis)
			}
			// Every message is acked; a consumer's last ack may still be on
			// its way when the run ends. INFO commandstats counts the whole
			// server's commands, and make test runs other modules' tests on
			// the same Redis at the same time, so only the lower bound holds.
			if acks := m.commands["XACK"].calls; acks < int64(cfg.messages-cfg.consumers) {
				t.Errorf("%s, round %d: Redis counted %d XACKs for %d messages", r.variant.name, i+1, acks, cfg.messages)
			}
			if r.variant.server != noServer && !m.storeKnown {
				t.Errorf("%s, round %d: the store's server's CPU was not measured", r.variant.name, i+1)
			}
			storeCPU += m.store
			if r.variant.once {
				if m.once != nil {
					t.Errorf("%s, round %d: %v", r.variant.name, i+1, m.once)
				}
				if want := int64(duplicateCount(cfg.messages, cfg.duplicates)); !r.variant.peer && m.duplicates != want {
					t.Errorf("%s, round %d: %d deliveries dropped as duplicates, want %d", r.variant.name, i+1, m.duplicates, want)
				}
				waited += m.waited
			}
			// Without middleware every copy runs the handler: the check
			// that finds a key run twice finds the duplicates.
			if r.variant.name == "none" && (m.copies != nil || m.once == nil) {
				t.Errorf("none, round %d: per copy: %v; once per key: %v (want an error)", i+1, m.copies, m.once)
			}
		}
		if r.variant.server != noServer && storeCPU <= 0 {
			t.Errorf("%s: the store's server's CPU over %d rounds: %v, must be positive", r.variant.name, cfg.rounds, storeCPU)
		}
	}
	if waited == 0 {
		t.Error("no delivery found its key in progress: the runs did not exercise waiting for a holder")
	}
}

// TestRunFailsUnlessOncePerKey runs variants that claim to run each key
// once and do not: the benchmark must fail.
func TestRunFailsUnlessOncePerKey(t *testing.T) {
	passThrough := func(context.Context, *env, string, idempotency.Observer) (message.HandlerMiddleware, func(), error) {
		return nil, func() {}, nil
	}
	dropAll := func(context.Context, *env, string, idempotency.Observer) (message.HandlerMiddleware, func(), error) {
		return func(message.HandlerFunc) message.HandlerFunc {
			return func(*message.Message) ([]*message.Message, error) { return nil, nil }
		}, func() {}, nil
	}
	saved := variants
	t.Cleanup(func() { variants = saved })
	variants = append(variants[:len(variants):len(variants)],
		variant{name: "twice", once: true, setup: passThrough},
		variant{name: "lost", once: true, setup: dropAll})

	for _, c := range []struct{ variant, want string }{
		{"twice", "ran more than once"},
		{"lost", "never ran"},
	} {
		cfg := testConfig(t)
		cfg.variants = []string{c.variant}
		cfg.rounds = 1
		_, err := run(context.Background(), cfg, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one saying %q", c.variant, err, c.want)
		}
	}
}

// TestCheck counts runs per key against what was published.
func TestCheck(t *testing.T) {
	w := &workload{uuids: []string{"a", "b", "c", "d"}, copies: []int32{1, 2, 1, 2}}
	for _, c := range []struct {
		runs         []int32
		once, copies string // "" for no error
	}{
		{runs: []int32{1, 1, 1, 1}, copies: "2 of 4 keys ran other than once per copy"},
		{runs: []int32{1, 2, 1, 2}, once: "2 of 4 keys ran more than once (d ran 2 times)"},
		{runs: []int32{1, 1, 0, 1}, once: "1 of 4 keys never ran (c never ran)", copies: "3 of 4"},
		{runs: []int32{2, 1, 0, 1}, once: "1 of 4 keys ran more than once (a ran 2 times); 1 of 4 keys never ran (c never ran)", copies: "4 of 4"},
	} {
		runs := make([]atomic.Int32, len(c.runs))
		for i, n := range c.runs {
			runs[i].Store(n)
		}
		once, copies := check(w, runs)
		for _, got := range []struct {
			name string
			err  error
			want string
		}{{"once", once, c.once}, {"copies", copies, c.copies}} {
			if (got.err == nil) != (got.want == "") || (got.err != nil && !strings.Contains(got.err.Error(), got.want)) {
				t.Errorf("runs %v: %s: got %v, want %q", c.runs, got.name, got.err, got.want)
			}
		}
	}
}

// TestWorkload checks the published order: every key first as itself,
// its copies after it and within the spread.
func TestWorkload(t *testing.T) {
	for _, c := range []struct {
		n      int
		dup    float64
		spread int
	}{{1000, 0.2, 10}, {1000, 0.5, 1}, {1, 0.9, 5}, {3, 0.99, 2}} {
		w := newWorkload(c.n, c.dup, c.spread, 0)
		if len(w.order) != c.n || len(w.uuids) != c.n-duplicateCount(c.n, c.dup) || len(w.uuids) < 1 {
			t.Errorf("%+v: %d published, %d keys", c, len(w.order), len(w.uuids))
			continue
		}
		// A key's first entry is its original; the originals are in key
		// order, each copy lands between original key+0 and key+spread-1
		// (inclusive) and the next original, or at the end.
		seen := make([]bool, len(w.uuids))
		next := int32(0) // the next original
		for _, k := range w.order {
			if !seen[k] {
				if k != next {
					t.Fatalf("%+v: key %d first published before key %d", c, k, next)
				}
				seen[k] = true
				next++
				continue
			}
			if last := next - 1; last < k || last > k+int32(c.spread)-1 {
				t.Fatalf("%+v: a copy of key %d after original %d, want within %d of it", c, k, last, c.spread)
			}
		}
	}
}

// TestPeersCheckTheirOwner runs each peer with an owner check on a
// message whose claim another delivery takes while the handler runs: the
// peer must fail the message, and leave the other's claim as it was.
func TestPeersCheckTheirOwner(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	cfg.runID = "owner" + strconv.FormatInt(time.Now().UnixNano(), 36)
	e := &env{cfg: cfg, redis: redis.NewClient(&redis.Options{Addr: cfg.redisAddr})}
	t.Cleanup(func() {
		e.deleteKeys(e.name("*"))
		_ = e.redis.Close()
	})
	pool, err := pgxpool.New(ctx, cfg.pgURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db, err := sql.Open("mysql", cfg.mysqlDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	// take gives key's claim another token; token reads it.
	for _, c := range []struct {
		variant     string
		take, token func(id, key string) (string, error)
	}{
		{"redis-cas",
			func(id, key string) (string, error) {
				return "", e.redis.Set(ctx, e.name(id, "cas")+":"+key, "another", time.Minute).Err()
			},
			func(id, key string) (string, error) { return e.redis.Get(ctx, e.name(id, "cas")+":"+key).Result() }},
		{"pg-cas",
			func(id, key string) (string, error) {
				_, err := pool.Exec(ctx, "UPDATE "+sqlName(e.name(id, "claims"))+" SET token = 'another' WHERE key = $1", key)
				return "", err
			},
			func(id, key string) (tok string, err error) {
				err = pool.QueryRow(ctx, "SELECT CASE WHEN done THEN 'done' ELSE token END FROM "+sqlName(e.name(id, "claims"))+" WHERE key = $1", key).Scan(&tok)
				return tok, err
			}},
		{"mysql-cas",
			func(id, key string) (string, error) {
				_, err := db.ExecContext(ctx, "UPDATE `"+sqlName(e.name(id, "claims"))+"` SET token = 'another' WHERE `key` = ?", key)
				return "", err
			},
			func(id, key string) (tok string, err error) {
				err = db.QueryRowContext(ctx, "SELECT IF(done, 'done', token) FROM `"+sqlName(e.name(id, "claims"))+"` WHERE `key` = ?", key).Scan(&tok)
				return tok, err
			}},
	} {
		t.Run(c.variant, func(t *testing.T) {
			v, ok := lookupVariant(c.variant)
			if !ok {
				t.Fatalf("no variant %s", c.variant)
			}
			mw, undo, err := v.setup(ctx, e, c.variant, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer undo()
			h := mw(func(msg *message.Message) ([]*message.Message, error) {
				_, err := c.take(c.variant, msg.UUID)
				return nil, err
			})
			msg := message.NewMessage("k1", nil)
			if _, err := h(msg); !errors.Is(err, errClaimLost) {
				t.Errorf("a delivery whose claim was taken: got %v, want %v", err, errClaimLost)
			}
			if tok, err := c.token(c.variant, msg.UUID); err != nil || tok != "another" {
				t.Errorf("the claim that took the key: %q, %v; want it left as it was", tok, err)
			}
		})
	}
}
