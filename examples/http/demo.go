package main

// The demonstration, apart from the service: it runs the service as a
// child process (this program with -serve), sends it requests as clients
// that retry would, kills it in the middle of a request and starts it
// again, waits until every order is charged, and checks what happened.
// Every claim it prints is computed from what the clients received and
// what the orders and charges tables and the OrderPlaced stream hold; the
// program exits non-zero if one is false.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// The demo's requests.
const (
	retried    = 10 // orders sent twice each, as a client that timed out retries
	concurrent = 20 // copies of one order sent at once
)

type demo struct {
	cfg    config
	client *http.Client

	mu        sync.Mutex
	responses map[string]int            // by kind: created, replayed, conflict, mismatch, lost
	bodies    map[string]map[string]int // the 201 bodies each key got, counted
}

// runDemo runs the service in a child process and the demonstration
// against it, then prints the summary and the verdict.
func runDemo(ctx context.Context, cfg config) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a free port for the service
	if err != nil {
		return err
	}
	cfg.httpAddr = ln.Addr().String()
	_ = ln.Close()
	d := &demo{cfg: cfg, client: &http.Client{Timeout: time.Minute}, responses: map[string]int{}, bodies: map[string]map[string]int{}}

	svc, err := d.start(ctx)
	if err != nil {
		return err
	}
	defer func() { svc.stop() }()

	fmt.Printf("== %d orders, each sent again as a retry with the same key\n", retried)
	for i := 1; i <= retried; i++ {
		for range 2 {
			if err := d.order(ctx, fmt.Sprintf("k-%d", i), fmt.Sprintf(`{"item":"book-%d","amount_cents":%d}`, i, 100*i)); err != nil {
				return err
			}
		}
	}

	fmt.Printf("== one order, %d copies at once; a copy answered 409 comes back after a pause\n", concurrent)
	var wg sync.WaitGroup
	errs := make(chan error, concurrent)
	for range concurrent {
		wg.Go(func() { errs <- d.order(ctx, "race", `{"item":"lamp","amount_cents":4500}`) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}

	fmt.Println("== the key of the first order, reused for another order")
	if err := d.mismatch(ctx, "k-1", `{"item":"a different book","amount_cents":999}`); err != nil {
		return err
	}

	fmt.Println("== an order whose service is killed (SIGKILL) inside its transaction, then started again")
	lost := make(chan error, 1)
	go func() { lost <- d.once(ctx, "crash", `{"item":"`+slowItem+`","amount_cents":7700}`) }()
	time.Sleep(slowFor / 3) // the order is inside its transaction
	svc.kill()
	if err := <-lost; err == nil {
		return errors.New("the request to the killed service succeeded")
	}
	d.count("lost", "")
	if svc, err = d.start(ctx); err != nil {
		return err
	}
	if err := d.order(ctx, "crash", `{"item":"`+slowItem+`","amount_cents":7700}`); err != nil {
		return err
	}

	fmt.Println("== waiting until every order is charged")
	obs, err := d.observe(ctx, retried+2)
	if err != nil {
		return err
	}
	if err := svc.stop(); err != nil {
		return fmt.Errorf("the service: %w", err)
	}
	d.mu.Lock()
	obs.responses, obs.bodies = d.responses, d.bodies
	d.mu.Unlock()

	fmt.Println("Summary:")
	for _, line := range obs.sums() {
		fmt.Println(line)
	}
	if err := obs.check(); err != nil {
		fmt.Printf("Check FAILED: %v\n", err)
		return err
	}
	fmt.Printf("Check: %d keys, %d orders created and charged exactly once each, every retry answered with its original response; every sum above adds up.\n", obs.keys(), obs.keys())
	return nil
}

// service is the child process.
type service struct {
	cmd  *exec.Cmd
	done chan error
}

func (d *demo) start(ctx context.Context) (*service, error) {
	cmd := exec.CommandContext(ctx, os.Args[0], "-serve")
	cmd.Env = append(os.Environ(), "HTTP_ADDR="+d.cfg.httpAddr, "DATABASE_URL="+d.cfg.databaseURL, "REDIS_ADDR="+d.cfg.redisAddr, "PREFIX="+d.cfg.prefix)
	cmd.Stdout, cmd.Stderr = prefixed("service| "), prefixed("service| ")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &service{cmd: cmd, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err := d.client.Get("http://" + d.cfg.httpAddr + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			return s, nil
		}
		select {
		case err := <-s.done:
			return nil, fmt.Errorf("the service exited: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.kill()
			return nil, errors.New("the service did not answer within a minute")
		}
	}
}

func (s *service) kill() {
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.done <- errors.New("killed")
}

// stop stops the service gracefully and returns how it ended.
func (s *service) stop() error {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	err := <-s.done
	s.done <- err
	return err
}

// once sends POST /orders once and counts its answer.
func (d *demo) once(ctx context.Context, key, body string) error {
	status, got, replayed, err := d.post(ctx, key, body)
	if err != nil {
		return err
	}
	switch {
	case status == http.StatusCreated && replayed:
		d.count("replayed", key, got)
	case status == http.StatusCreated:
		d.count("created", key, got)
	case status == http.StatusConflict:
		d.count("conflict", "")
		return errConflict
	default:
		return fmt.Errorf("key %s: status %d: %s", key, status, got)
	}
	return nil
}

var errConflict = errors.New("409 Conflict")

// order sends POST /orders until it is not answered 409, as a client
// does after Retry-After (sooner here, to keep the demo short).
func (d *demo) order(ctx context.Context, key, body string) error {
	for deadline := time.Now().Add(time.Minute); ; {
		err := d.once(ctx, key, body)
		if !errors.Is(err, errConflict) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// mismatch sends a request that must be refused 422.
func (d *demo) mismatch(ctx context.Context, key, body string) error {
	status, got, _, err := d.post(ctx, key, body)
	if err != nil {
		return err
	}
	if status != http.StatusUnprocessableEntity {
		return fmt.Errorf("key %s reused for another order: status %d, want 422: %s", key, status, got)
	}
	d.count("mismatch", "")
	return nil
}

func (d *demo) post(ctx context.Context, key, body string) (status int, got string, replayed bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.cfg.httpAddr+"/orders", strings.NewReader(body))
	if err != nil {
		return 0, "", false, err
	}
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	req.Header.Set("X-Customer", "ada")
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, "", false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true", err
}

func (d *demo) count(kind, key string, body ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.responses[kind]++
	for _, b := range body {
		if d.bodies[key] == nil {
			d.bodies[key] = map[string]int{}
		}
		d.bodies[key][b]++
	}
}

// observe waits until the charges table holds a charge of every order,
// at most a minute, and returns what the tables and the stream hold.
func (d *demo) observe(ctx context.Context, want int) (*observations, error) {
	pool, err := pgxpool.New(ctx, d.cfg.databaseURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	rdb := redis.NewClient(&redis.Options{Addr: d.cfg.redisAddr})
	defer rdb.Close()
	n := namesFor(d.cfg.prefix)
	o := &observations{}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if o.charges, err = countBy(ctx, pool, `SELECT order_id, count(*) FROM `+n.charges+` GROUP BY 1`); err != nil {
			return nil, err
		}
		if len(o.charges) >= want || time.Now().After(deadline) {
			break
		}
	}
	if o.orders, err = countBy(ctx, pool, `SELECT idempotency_key, count(*) FROM `+n.orders+` GROUP BY 1`); err != nil {
		return nil, err
	}
	if o.orderIDs, err = countBy(ctx, pool, `SELECT id, 1 FROM `+n.orders); err != nil {
		return nil, err
	}
	entries, err := rdb.XRange(ctx, n.placed, "-", "+").Result()
	if err != nil {
		return nil, err
	}
	o.placed = map[string]int{}
	for _, e := range entries {
		id, _ := e.Values["_watermill_message_uuid"].(string)
		o.placed[id]++
	}
	return o, nil
}

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

// observations is what the check reads.
type observations struct {
	responses map[string]int            // what the clients got, by kind
	bodies    map[string]map[string]int // the 201 bodies by key
	orders    map[string]int            // order rows by idempotency key
	orderIDs  map[string]int
	placed    map[string]int // OrderPlaced entries on the stream, by message UUID
	charges   map[string]int // charge rows by order ID
}

func (o *observations) keys() int { return len(o.bodies) }

// sum is a line of the summary: a total and the parts it is made of,
// each read from where it happened. The check fails unless they add up.
type sum struct {
	label string
	total int
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
	return fmt.Sprintf("  %s: %d = %s", s.label, s.total, strings.Join(terms, " + "))
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

func (o *observations) sums() []sum {
	r := o.responses
	sent := 2*retried + concurrent + 1 + 2 // the retried pairs, the copies, the reused key, the crash and its retry
	line := func(label string, m map[string]int, first, again string) sum {
		total, keys, more := once(m)
		return sum{label: label, total: total, parts: []part{{keys, first}, {more, again}}}
	}
	return []sum{
		{label: "requests answered or lost", total: sent + r["conflict"], parts: []part{
			{r["created"], "created (201)"}, {r["replayed"], "replayed (201, Idempotent-Replayed: true)"},
			{r["conflict"], "answered 409 while the key's first request ran, and sent again"}, {r["mismatch"], "refused 422, a key reused for another order"},
			{r["lost"], "lost with the killed service"}}},
		line("order rows", o.orders, "keys with an order", "orders of a key that had one"),
		line("OrderPlaced on the stream", o.placed, "orders", "forwarded again (at least once)"),
		line("charge rows", o.charges, "orders charged", "charges of an order charged before"),
	}
}

// check returns every claim that is false.
func (o *observations) check() error {
	var errs []error
	for _, s := range o.sums() {
		if err := s.check(); err != nil {
			errs = append(errs, err)
		}
	}
	want := retried + 2
	if o.keys() != want {
		errs = append(errs, fmt.Errorf("%d keys got a 201, want %d", o.keys(), want))
	}
	for key, bodies := range o.bodies {
		if len(bodies) != 1 {
			errs = append(errs, fmt.Errorf("key %s: %d different 201 bodies, want one", key, len(bodies)))
		}
	}
	if o.responses["created"] != want {
		errs = append(errs, fmt.Errorf("%d requests created an order, want %d, one per key", o.responses["created"], want))
	}
	if o.responses["mismatch"] != 1 || o.responses["lost"] != 1 {
		errs = append(errs, fmt.Errorf("%d refused 422 and %d lost, want 1 and 1", o.responses["mismatch"], o.responses["lost"]))
	}
	for what, m := range map[string]map[string]int{"created": o.orders, "charged": o.charges} {
		if total, keys, _ := once(m); total != want || keys != want {
			errs = append(errs, fmt.Errorf("%d of %d orders %s, %d times in all, not once each", keys, want, what, total))
		}
	}
	for id := range o.orderIDs {
		if o.charges[id] != 1 || o.placed[id] < 1 {
			errs = append(errs, fmt.Errorf("order %s: %d charges, %d OrderPlaced on the stream", id, o.charges[id], o.placed[id]))
		}
	}
	return errors.Join(errs...)
}

// prefixed writes a child's output to this program's, each line prefixed.
func prefixed(prefix string) io.Writer { return &linePrefixer{prefix: prefix} }

type linePrefixer struct {
	mu     sync.Mutex
	prefix string
	buf    []byte
}

func (l *linePrefixer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		fmt.Print(l.prefix + string(l.buf[:i+1]))
		l.buf = l.buf[i+1:]
	}
}
