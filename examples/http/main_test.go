package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/examples/internal/exampletest"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

// prefixFor returns a prefix for the example's streams and tables: short
// (Postgres names end at 63 bytes), made of what Postgres takes unquoted,
// and holding the run's id ($IDEM_TEST_RUN), by which make test finds the
// run's keys on a Redis the user shares.
func prefixFor(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, strings.ToLower(fmt.Sprintf("%s%s_%d_", name, os.Getenv("IDEM_TEST_RUN"), time.Now().UnixNano()%1e9)))
}

// setup returns the example's configuration for a test, and drops the
// example's tables and stream when the test ends.
func setup(t *testing.T, prefix string) (*pgxpool.Pool, *redis.Client, []string) {
	pool := testenv.PostgresPool(t)
	client := testenv.RedisClient(t)
	n := namesFor(prefix)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+n.orders+`, `+n.charges+`, `+n.keys+`, "watermill_`+n.outbox+`", "watermill_offsets_`+n.outbox+`"`)
		client.Del(ctx, n.placed)
	})
	return pool, client, []string{
		"DATABASE_URL=" + testenv.Service(t, "TEST_DATABASE_URL"),
		"REDIS_ADDR=" + testenv.Service(t, "REDIS_ADDR"),
		"PREFIX=" + prefix,
	}
}

// The demo as a user runs it (`make example-http`): the program exits 0
// with its verdict last, and its summary is what Postgres and Redis hold:
// the orders, the charges, the keys of the requests and of the charges in
// the lease store, the OrderPlaced stream and its consumer group.
func TestHTTPExample(t *testing.T) {
	bin := exampletest.Build(t, ".")
	prefix := prefixFor("ex_http_")
	pool, client, env := setup(t, prefix)
	n := namesFor(prefix)
	p := exampletest.Start(t, "the http example", bin, nil, env...)
	if code := p.Wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	summary, err := exampletest.ParseSummary(p.Output(), fmt.Sprintf("Check: %d keys, %d orders created, read back and charged exactly once each", wantKeys, wantKeys))
	if err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	count := func(sql string) int {
		t.Helper()
		var c int
		if err := pool.QueryRow(ctx, sql).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The lease store's records, by namespace: a request's key is
	// completed whatever its stored answer (a 201 or a 400), a charge's
	// once the charge committed.
	const completed = 3
	records := func(namespace string) string {
		return `SELECT count(*) FROM ` + n.keys + ` WHERE convert_from(key, 'UTF8') LIKE '` + namespace + `:%' AND state = ` + fmt.Sprint(completed)
	}
	e := exampletest.Expect{Summary: summary}
	e.Total("keys sent", count(records("orders-api")))
	e.Part("keys sent", "answered 201 with one body", wantKeys)
	e.Total("order rows", count(`SELECT count(*) FROM `+n.orders))
	e.Part("order rows", "keys with an order", count(`SELECT count(DISTINCT idempotency_key) FROM `+n.orders))
	e.Total("orders read back", wantKeys)
	e.Part("orders read back", "as their 201 said", wantKeys)
	e.Total("order rows when the API was killed", wantKeys-1)
	e.Part("order rows when the API was killed", "left by the killed request", 0)
	e.Total("OrderPlaced on the stream", int(client.XLen(ctx, n.placed).Val()))
	e.Part("OrderPlaced on the stream", "orders", wantKeys)
	e.Total("charge rows", count(`SELECT count(*) FROM `+n.charges))
	e.Part("charge rows", "orders charged", count(`SELECT count(DISTINCT order_id) FROM `+n.charges))
	e.Part("charge rows", "orders charged", count(records("charge")))
	e.Part("POST /orders requests", "created (201)", wantKeys)
	e.Part("POST /orders requests", "refused 400", 1)
	e.Part("POST /orders requests", "replayed 400s", 1)
	e.Part("POST /orders requests", "refused 422", 1)
	e.Part("POST /orders requests", "lost with the killed API", 1)
	e.Part("POST /orders requests", "answered otherwise", 0)
	e.That(e.Value("POST /orders requests", "replayed 201s") >= retried, "fewer replays than retries")
	// The order of the killed request's key was created by a later lease:
	// the only order whose fencing token is not 1.
	e.That(count(`SELECT count(*) FROM `+n.orders+` WHERE fencing_token > 1`) == 1, "not one order created under a later lease")
	pending, err := client.XPending(ctx, n.placed, n.group).Result()
	if err != nil {
		t.Fatal(err)
	}
	e.That(pending.Count == 0, "%d OrderPlaced pending in the consumer group", pending.Count)
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
}

// The service alone (-serve), as a client sees it: a POST creates the
// order, its retry gets the same 201 marked replayed, GET on the Location
// reads the order back, a request without a key or a customer is refused,
// the order is charged once, and SIGTERM shuts the service down cleanly.
func TestHTTPServe(t *testing.T) {
	bin := exampletest.Build(t, ".")
	prefix := prefixFor("ex_https_")
	pool, _, env := setup(t, prefix)
	n := namesFor(prefix)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	p := exampletest.Start(t, "the http service", bin, []string{"-serve"}, append(env, "HTTP_ADDR="+addr)...)
	p.WaitFor(regexp.MustCompile(`msg=listening addr=`+regexp.QuoteMeta(addr)), time.Minute)

	post := func(key, customer, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/orders", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		if customer != "" {
			req.Header.Set("X-Customer", customer)
		}
		return do(t, req)
	}
	body := `{"item":"book","amount_cents":1200}`
	first, created := post(`"k-1"`, "ada", body)
	if first.StatusCode != http.StatusCreated || first.Header.Get("Location") == "" || first.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first POST: %s, Location %q, Idempotent-Replayed %q: %s", first.Status, first.Header.Get("Location"), first.Header.Get("Idempotent-Replayed"), created)
	}
	retry, again := post(`"k-1"`, "ada", body)
	if retry.StatusCode != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "true" || again != created ||
		retry.Header.Get("Location") != first.Header.Get("Location") {
		t.Errorf("the retry: %s, Idempotent-Replayed %q, Location %q: %s; want the first's 201 replayed: %s",
			retry.Status, retry.Header.Get("Idempotent-Replayed"), retry.Header.Get("Location"), again, created)
	}
	other, _ := post(`"k-1"`, "grace", body) // the same key for another customer: another order
	if other.StatusCode != http.StatusCreated || other.Header.Get("Idempotent-Replayed") != "" {
		t.Errorf("the same key for another customer: %s, Idempotent-Replayed %q; want a new 201", other.Status, other.Header.Get("Idempotent-Replayed"))
	}
	for name, send := range map[string]func() (*http.Response, string){
		"no key":      func() (*http.Response, string) { return post("", "ada", body) },
		"no customer": func() (*http.Response, string) { return post(`"k-2"`, "", body) },
	} {
		got, text := send()
		if got.StatusCode != http.StatusBadRequest || got.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %s %q: %s; want 400 problem+json", name, got.Status, got.Header.Get("Content-Type"), text)
		}
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+first.Header.Get("Location"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, read := do(t, req); resp.StatusCode != http.StatusOK || read != created {
		t.Errorf("GET %s: %s %s; want 200 %s", first.Header.Get("Location"), resp.Status, read, created)
	}
	req, _ = http.NewRequest(http.MethodGet, "http://"+addr+"/orders/no-such-order", nil)
	if resp, _ := do(t, req); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET of an unknown order: %s, want 404", resp.Status)
	}

	// Both orders are charged, once each.
	ctx := context.Background()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		var rows, orders int
		if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT order_id) FROM `+n.charges).Scan(&rows, &orders); err != nil {
			t.Fatal(err)
		}
		if orders == 2 && rows == 2 {
			break
		}
		if rows > orders || time.Now().After(deadline) {
			t.Fatalf("%d charge rows for %d orders, want 2 orders charged once each", rows, orders)
		}
	}
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(time.Minute); code != 0 {
		t.Fatalf("exit status %d after SIGTERM", code)
	}
	p.WaitFor(regexp.MustCompile(`msg="shut down: no request or handler running"`), time.Second)
}

func do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// goodRun is what a run in which every claim holds observes.
func goodRun() *observations {
	o := &observations{
		sent: 65, keys: wantKeys + 1,
		answers: map[string]int{created: wantKeys, replayed: 29, conflict: 20, badRequest: 1, badReplayed: 1, mismatch: 1, lost: 1},
		bodies:  map[string]map[string]int{}, readBack: map[string]bool{},
		orders: map[string]int{}, orderIDs: map[string]int{}, placed: map[string]int{}, charges: map[string]int{},
		beforeKill: wantKeys - 1, afterKill: wantKeys - 1, killedToken: 1, retryToken: 2,
	}
	for i := range wantKeys {
		key, id := fmt.Sprintf("k-%d", i), fmt.Sprintf("order-%d", i)
		o.bodies[key] = map[string]int{`{"order_id":"` + id + `"}`: 2}
		o.readBack[key] = true
		o.orders["orders-api:"+key] = 1
		o.orderIDs[id], o.placed[id], o.charges[id] = 1, 1, 1
	}
	return o
}

// The check catches every false claim: each broken observation below is
// one a broken service would produce, and fails the check, with a reason
// that names it.
func TestCheckFindsFalseClaims(t *testing.T) {
	if err := goodRun().check(); err != nil {
		t.Fatalf("a good run fails the check: %v", err)
	}
	for name, c := range map[string]struct {
		breakIt func(o *observations)
		says    string
	}{
		"a retry created a second order": {func(o *observations) {
			o.answers[created]++
			o.answers[replayed]--
			o.orders["orders-api:k-1"]++
			o.orderIDs["order-x"], o.placed["order-x"], o.charges["order-x"] = 1, 1, 1
		}, "requests created an order"},
		"a retry got another body": {func(o *observations) { o.bodies["k-1"]["{}"] = 1 }, "with several"},
		"a copy got a 409 without Retry-After": {func(o *observations) {
			o.answers[conflict]--
			o.answers[otherwise]++
		}, "answered otherwise"},
		"the 400 was not stored": {func(o *observations) {
			o.answers[badReplayed]--
			o.answers[badRequest]++
		}, "a 400 is stored"},
		"the reused key was not refused": {func(o *observations) {
			o.answers[mismatch]--
			o.answers[replayed]++
		}, "refused 422"},
		"an order charged twice": {func(o *observations) { o.charges["order-1"]++ }, "order order-1: 2 charges"},
		"an order not charged":   {func(o *observations) { delete(o.charges, "order-1") }, "order order-1: 0 charges"},
		"an order never on the stream": {func(o *observations) {
			delete(o.placed, "order-1")
		}, "order order-1: 1 charges, 0 OrderPlaced"},
		"OrderPlaced left unacked": {func(o *observations) { o.unacked = 1 }, "not acked"},
		"an order read back otherwise": {func(o *observations) {
			o.readBack["k-1"] = false
		}, "key k-1: its order read back"},
		"the killed request left its order":  {func(o *observations) { o.afterKill++ }, "the killed request left 1 order rows"},
		"the retry ran under the dead lease": {func(o *observations) { o.retryToken = o.killedToken }, "not a later lease"},
		"a sum that does not add up":         {func(o *observations) { o.sent++ }, "but its parts make"},
	} {
		t.Run(name, func(t *testing.T) {
			o := goodRun()
			o.answers = maps.Clone(o.answers)
			c.breakIt(o)
			err := o.check()
			if err == nil {
				t.Fatal("the check passes")
			}
			if !strings.Contains(err.Error(), c.says) {
				t.Errorf("the check fails with %q, which does not say %q", err, c.says)
			}
		})
	}
}
