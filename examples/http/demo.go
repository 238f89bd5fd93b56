package main

// The demonstration, apart from the service: it runs the service as a
// child process (this program with -serve), sends it requests as clients
// that retry would, kills it in the middle of a request and starts it
// again, reads every order back, waits until every order is charged, and
// checks what happened. Every claim it prints is computed from what the
// clients received, what the service logged, and what the orders and
// charges tables, the OrderPlaced stream and its consumer group hold; the
// program exits non-zero if one is false.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// The demo's requests.
const (
	retried    = 10 // orders sent twice each, as a client that timed out retries
	concurrent = 20 // copies of one order sent at once
	customer   = "ada"
	// raceSlow is how long the order of the concurrent copies waits in
	// its transaction: the other copies find its key in progress.
	raceSlow = 500 * time.Millisecond
)

// The answers to POST /orders, as the summary counts them.
const (
	created     = "created"            // 201
	replayed    = "replayed"           // 201 with Idempotent-Replayed: true
	conflict    = "conflict"           // 409 with a Retry-After
	badRequest  = "bad request"        // 400
	badReplayed = "bad request again"  // 400 with Idempotent-Replayed: true
	mismatch    = "mismatch"           // 422
	lost        = "lost"               // no answer: the service was killed
	otherwise   = "answered otherwise" // anything else: a claim is false
)

type demo struct {
	cfg    config
	exe    string // this program, run with -serve
	client *http.Client

	mu        sync.Mutex
	sent      int
	keys      map[string]bool           // every key sent
	answers   map[string]int            // by kind
	bodies    map[string]map[string]int // the 201 bodies each key got, counted
	locations map[string]string         // the Location of each key's 201
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
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, cfg.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb := redis.NewClient(&redis.Options{Addr: cfg.redisAddr})
	defer rdb.Close()
	n := namesFor(cfg.prefix)
	d := &demo{
		cfg: cfg, exe: exe, client: &http.Client{Timeout: time.Minute},
		keys: map[string]bool{}, answers: map[string]int{}, bodies: map[string]map[string]int{}, locations: map[string]string{},
	}

	svc, err := d.start(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = svc.stop() }()

	fmt.Printf("== %d orders, each sent again with the same key, as a client that timed out retries\n", retried)
	for i := 1; i <= retried; i++ {
		for range 2 {
			if _, err := d.order(ctx, fmt.Sprintf("k-%d", i), fmt.Sprintf(`{"item":"book-%d","amount_cents":%d}`, i, 100*i), nil); err != nil {
				return err
			}
		}
	}

	fmt.Printf("== one order, %d copies at once, each held %v in its transaction; a copy answered 409 is sent again after its Retry-After\n", concurrent, raceSlow)
	var wg sync.WaitGroup
	errs := make(chan error, concurrent)
	for range concurrent {
		wg.Go(func() {
			_, err := d.order(ctx, "race", `{"item":"lamp","amount_cents":4500}`, http.Header{slowHeader: {raceSlow.String()}})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}

	fmt.Println("== a malformed body, sent twice with one key")
	for range 2 {
		if _, err := d.once(ctx, "malformed", `{"item":"book","amount_cents":`, nil); err != nil {
			return err
		}
	}

	fmt.Println("== the key of the first order, reused for another order")
	if _, err := d.once(ctx, "k-1", `{"item":"a different book","amount_cents":999}`, nil); err != nil {
		return err
	}

	fmt.Println("== an order whose API is killed (SIGKILL) inside its transaction; the API is started again, the client retries with the same key")
	crash := `{"item":"desk","amount_cents":7700}`
	var before, after int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+n.orders).Scan(&before); err != nil {
		return err
	}
	inside := svc.out.await("a slow order, inside its transaction")
	answered := make(chan error, 1)
	go func() {
		_, err := d.once(ctx, "crash", crash, http.Header{slowHeader: {maxSlow.String()}})
		answered <- err
	}()
	var line string
	select {
	case line = <-inside:
	case err := <-answered:
		return fmt.Errorf("the slow request ended before the kill: %v", err)
	case <-time.After(time.Minute):
		return errors.New("the slow request did not reach its transaction within a minute")
	}
	svc.kill()
	if err := <-answered; err == nil {
		return errors.New("the request to the killed API was answered")
	}
	d.count(lost, "", "", "")
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+n.orders).Scan(&after); err != nil {
		return err
	}
	m := regexp.MustCompile(`fencing_token=(\d+)`).FindStringSubmatch(line)
	if m == nil {
		return fmt.Errorf("no fencing token in the API's line %q", line)
	}
	killedToken, _ := strconv.ParseInt(m[1], 10, 64)
	fmt.Printf("   killed inside the order's transaction (fencing token %d): %d order rows before the request, %d after the kill\n", killedToken, before, after)
	if svc, err = d.start(ctx); err != nil {
		return err
	}
	conflicts := d.answered(conflict)
	body, err := d.order(ctx, "crash", crash, nil)
	if err != nil {
		return err
	}
	var o order
	var retryToken int64 // 0 (the check fails) unless the retry's 201 names its order
	if err := json.Unmarshal([]byte(body), &o); err == nil && o.ID != "" {
		if err := pool.QueryRow(ctx, `SELECT fencing_token FROM `+n.orders+` WHERE id = $1`, o.ID).Scan(&retryToken); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
	}
	waited := "no 409: the killed request's lease had run out"
	if c := d.answered(conflict) - conflicts; c > 0 {
		waited = fmt.Sprintf("%d× 409 while the killed request's lease ran out", c)
	}
	fmt.Printf("   the retry: %s, then 201: order %s, fencing token %d\n", waited, o.ID, retryToken)

	fmt.Println("== every order read back with GET on its 201's Location")
	readBack, err := d.readBack(ctx)
	if err != nil {
		return err
	}

	fmt.Println("== waiting until every OrderPlaced is consumed and every order charged")
	obs, err := d.observe(ctx, pool, rdb)
	if err != nil {
		return err
	}
	if err := svc.stop(); err != nil {
		return fmt.Errorf("the API did not shut down cleanly: %w", err)
	}
	d.mu.Lock()
	obs.sent, obs.keys, obs.answers, obs.bodies = d.sent, len(d.keys), d.answers, d.bodies
	d.mu.Unlock()
	obs.readBack = readBack
	obs.beforeKill, obs.afterKill, obs.killedToken, obs.retryToken = before, after, killedToken, retryToken

	fmt.Println("Summary:")
	for _, line := range obs.sums() {
		fmt.Println(line)
	}
	if err := obs.check(); err != nil {
		fmt.Printf("Check FAILED: %v\n", err)
		return err
	}
	fmt.Printf("Check: %d keys, %d orders created, read back and charged exactly once each; every retry got its key's first answer, "+
		"the killed request left nothing and its retry created its order; every sum above adds up.\n", wantKeys, wantKeys)
	return nil
}

// wantKeys is how many keys get an order: the retried ones, the one sent
// concurrently, the one whose API was killed.
const wantKeys = retried + 2

// service is the child process.
type service struct {
	cmd  *exec.Cmd
	out  *output
	done chan error
}

// start starts the service and waits until it answers.
func (d *demo) start(ctx context.Context) (*service, error) {
	cmd := exec.CommandContext(ctx, d.exe, "-serve")
	cmd.Env = append(os.Environ(), "HTTP_ADDR="+d.cfg.httpAddr, "DATABASE_URL="+d.cfg.databaseURL, "REDIS_ADDR="+d.cfg.redisAddr, "PREFIX="+d.cfg.prefix)
	s := &service{cmd: cmd, out: &output{prefix: "service| "}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = s.out, s.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.done <- cmd.Wait() }()
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err := d.client.Get("http://" + d.cfg.httpAddr + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			return s, nil
		}
		select {
		case err := <-s.done:
			return nil, fmt.Errorf("the API exited: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.kill()
			return nil, errors.New("the API did not answer within a minute")
		}
	}
}

// kill kills the service outright, as a crash would.
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

// answer is what a POST /orders got.
type answer struct {
	kind       string
	body       string
	retryAfter time.Duration // a 409's
}

// once sends POST /orders once and counts its answer: its kind and, for a
// 201, its body and Location.
func (d *demo) once(ctx context.Context, key, body string, header http.Header) (answer, error) {
	d.mu.Lock()
	d.sent++
	d.keys[key] = true
	d.mu.Unlock()
	resp, got, err := d.post(ctx, key, body, header)
	if err != nil {
		return answer{}, err
	}
	again := resp.Header.Get("Idempotent-Replayed") == "true"
	retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	var kind string
	switch {
	case resp.StatusCode == http.StatusCreated && again:
		kind = replayed
	case resp.StatusCode == http.StatusCreated:
		kind = created
	case resp.StatusCode == http.StatusConflict && retry >= 1:
		kind = conflict
	case resp.StatusCode == http.StatusBadRequest && again:
		kind = badReplayed
	case resp.StatusCode == http.StatusBadRequest:
		kind = badRequest
	case resp.StatusCode == http.StatusUnprocessableEntity:
		kind = mismatch
	default:
		kind = otherwise
		fmt.Printf("   key %s: %s (Retry-After %q): %s\n", key, resp.Status, resp.Header.Get("Retry-After"), strings.TrimSpace(got))
	}
	d.count(kind, key, got, resp.Header.Get("Location"))
	return answer{kind: kind, body: got, retryAfter: time.Duration(retry) * time.Second}, nil
}

// order sends POST /orders until it is not answered 409, waiting the
// Retry-After of each 409 as a client does, and returns the 201's body, or
// "" if the last answer was another (counted: the check fails).
func (d *demo) order(ctx context.Context, key, body string, header http.Header) (string, error) {
	for deadline := time.Now().Add(time.Minute); ; {
		a, err := d.once(ctx, key, body, header)
		switch {
		case err != nil:
			return "", err
		case a.kind == created || a.kind == replayed:
			return a.body, nil
		case a.kind != conflict:
			return "", nil
		case time.Now().After(deadline):
			return "", fmt.Errorf("key %s: answered 409 for a minute", key)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(a.retryAfter):
		}
	}
}

func (d *demo) post(ctx context.Context, key, body string, header http.Header) (*http.Response, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.cfg.httpAddr+"/orders", strings.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	req.Header.Set("X-Customer", customer)
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

func (d *demo) count(kind, key, body, location string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.answers[kind]++
	if kind != created && kind != replayed {
		return
	}
	if d.bodies[key] == nil {
		d.bodies[key] = map[string]int{}
	}
	d.bodies[key][body]++
	d.locations[key] = location
}

func (d *demo) answered(kind string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.answers[kind]
}

// readBack gets every key's order from the Location of its 201 and
// returns, by key, whether it is what the 201 said.
func (d *demo) readBack(ctx context.Context) (map[string]bool, error) {
	d.mu.Lock()
	locations := map[string]string{}
	first := map[string]string{}
	for key, loc := range d.locations {
		locations[key] = loc
		for body := range d.bodies[key] {
			first[key] = body
		}
	}
	d.mu.Unlock()
	same := map[string]bool{}
	for key, loc := range locations {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.cfg.httpAddr+loc, nil)
		if err != nil {
			return nil, err
		}
		resp, err := d.client.Do(req)
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, err
		}
		same[key] = resp.StatusCode == http.StatusOK && string(b) == first[key]
		if !same[key] {
			fmt.Printf("   GET %s (key %s): %s %q, its 201 said %q\n", loc, key, resp.Status, b, first[key])
		}
	}
	return same, nil
}

// observe waits until every order is on the OrderPlaced stream, every
// entry of the stream is acked by the consumer group, and every order is
// charged (at most two minutes), and returns what the tables and the
// stream hold.
func (d *demo) observe(ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client) (*observations, error) {
	n := namesFor(d.cfg.prefix)
	o := &observations{}
	var err error
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if o.orders, err = countBy(ctx, pool, `SELECT idempotency_key, count(*) FROM `+n.orders+` GROUP BY 1`); err != nil {
			return nil, err
		}
		if o.orderIDs, err = countBy(ctx, pool, `SELECT id, count(*) FROM `+n.orders+` GROUP BY 1`); err != nil {
			return nil, err
		}
		if o.charges, err = countBy(ctx, pool, `SELECT order_id, count(*) FROM `+n.charges+` GROUP BY 1`); err != nil {
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
		groups, err := rdb.XInfoGroups(ctx, n.placed).Result()
		if err != nil {
			return nil, err
		}
		o.unacked = -1 // until the group exists
		for _, g := range groups {
			if g.Name == n.group {
				o.unacked = g.Pending + g.Lag
			}
		}
		settled := o.unacked == 0
		for id := range o.orderIDs {
			settled = settled && o.placed[id] > 0 && o.charges[id] > 0
		}
		if settled || time.Now().After(deadline) {
			return o, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
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

// observations is what the check reads.
type observations struct {
	sent     int                       // POST /orders requests sent
	keys     int                       // the keys they carried
	answers  map[string]int            // their answers, by kind
	bodies   map[string]map[string]int // the 201 bodies each key got, counted
	readBack map[string]bool           // by key: GET on its 201's Location gave the 201's body
	orders   map[string]int            // order rows by idempotency key
	orderIDs map[string]int            // order rows by order ID
	placed   map[string]int            // OrderPlaced entries on the stream, by message UUID (the order ID)
	charges  map[string]int            // charge rows by order ID
	unacked  int64                     // OrderPlaced entries the consumer group has not acked (pending and lag), -1 without the group

	// The killed request: the order rows before it and after the kill,
	// its lease's fencing token (from the API's log), and the fencing
	// token of the order its retry created.
	beforeKill, afterKill   int
	killedToken, retryToken int64
}

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

// bodyKeys counts the keys answered 201 with one body, and with several.
func (o *observations) bodyKeys() (one, several int) {
	for _, bodies := range o.bodies {
		if len(bodies) == 1 {
			one++
		} else {
			several++
		}
	}
	return one, several
}

func (o *observations) sums() []sum {
	a := o.answers
	line := func(label string, m map[string]int, first, again string) sum {
		total, keys, more := once(m)
		return sum{label: label, total: total, parts: []part{{keys, first}, {more, again}}}
	}
	one, several := o.bodyKeys()
	same := 0
	for _, ok := range o.readBack {
		if ok {
			same++
		}
	}
	return []sum{
		{label: "POST /orders requests", total: o.sent, parts: []part{
			{a[created], "created (201)"}, {a[replayed], "replayed 201s (Idempotent-Replayed: true)"},
			{a[conflict], "answered 409 with Retry-After while the key's first request ran, and sent again after it"},
			{a[badRequest], "refused 400 (a malformed body)"}, {a[badReplayed], "replayed 400s (Idempotent-Replayed: true)"},
			{a[mismatch], "refused 422 (a key reused for another order)"}, {a[lost], "lost with the killed API"},
			{a[otherwise], "answered otherwise"}}},
		{label: "keys sent", total: o.keys, parts: []part{
			{one, "answered 201 with one body, retries included"}, {several, "answered 201 with different bodies"},
			{o.keys - one - several, "never answered 201 (the malformed body)"}}},
		line("order rows", o.orders, "keys with an order", "orders of a key that had one"),
		{label: "orders read back (GET on the 201's Location)", total: len(o.readBack), parts: []part{
			{same, "as their 201 said"}, {len(o.readBack) - same, "otherwise"}}},
		{label: "order rows when the API was killed", total: o.afterKill, parts: []part{
			{o.beforeKill, "before its slow request"}, {o.afterKill - o.beforeKill, "left by the killed request"}}},
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
	a := o.answers
	if one, several := o.bodyKeys(); one != wantKeys || several != 0 {
		errs = append(errs, fmt.Errorf("%d keys answered 201 with one body and %d with several, want %d and 0", one, several, wantKeys))
	}
	if a[created] != wantKeys {
		errs = append(errs, fmt.Errorf("%d requests created an order, want %d, one per key", a[created], wantKeys))
	}
	if a[replayed] < retried {
		errs = append(errs, fmt.Errorf("%d 201s replayed, fewer than the %d retries", a[replayed], retried))
	}
	if a[badRequest] != 1 || a[badReplayed] != 1 {
		errs = append(errs, fmt.Errorf("the malformed body: %d refused 400 and %d replayed, want 1 and 1 (a 400 is stored)", a[badRequest], a[badReplayed]))
	}
	if a[mismatch] != 1 || a[lost] != 1 || a[otherwise] != 0 {
		errs = append(errs, fmt.Errorf("%d refused 422, %d lost and %d answered otherwise, want 1, 1 and 0", a[mismatch], a[lost], a[otherwise]))
	}
	for what, m := range map[string]map[string]int{"created (by key)": o.orders, "created (by ID)": o.orderIDs, "charged": o.charges} {
		if total, keys, _ := once(m); total != wantKeys || keys != wantKeys {
			errs = append(errs, fmt.Errorf("%d orders %s, %d times in all, want %d once each", keys, what, total, wantKeys))
		}
	}
	for id := range o.orderIDs {
		if o.charges[id] != 1 || o.placed[id] < 1 {
			errs = append(errs, fmt.Errorf("order %s: %d charges, %d OrderPlaced on the stream", id, o.charges[id], o.placed[id]))
		}
	}
	if o.unacked != 0 {
		errs = append(errs, fmt.Errorf("%d OrderPlaced not acked by the consumer group (-1: no group)", o.unacked))
	}
	for key, ok := range o.readBack {
		if !ok {
			errs = append(errs, fmt.Errorf("key %s: its order read back is not what its 201 said", key))
		}
	}
	if len(o.readBack) != wantKeys {
		errs = append(errs, fmt.Errorf("%d orders read back, want %d", len(o.readBack), wantKeys))
	}
	if o.afterKill != o.beforeKill {
		errs = append(errs, fmt.Errorf("the killed request left %d order rows", o.afterKill-o.beforeKill))
	}
	if o.killedToken < 1 || o.retryToken <= o.killedToken {
		errs = append(errs, fmt.Errorf("the retry's order has fencing token %d, the killed request's lease had %d: not a later lease", o.retryToken, o.killedToken))
	}
	return errors.Join(errs...)
}

// output copies a child's output to this program's, each line prefixed,
// and hands the first line that holds a string to whoever awaits it.
type output struct {
	prefix string

	mu     sync.Mutex
	buf    []byte
	awaits []awaited
}

type awaited struct {
	s    string
	line chan string
}

// await returns a channel that receives the next line holding s.
func (o *output) await(s string) <-chan string {
	ch := make(chan string, 1)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.awaits = append(o.awaits, awaited{s: s, line: ch})
	return ch
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = append(o.buf, p...)
	for {
		i := strings.IndexByte(string(o.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(o.buf[:i])
		o.buf = o.buf[i+1:]
		fmt.Println(o.prefix + line)
		waiting := o.awaits[:0]
		for _, a := range o.awaits {
			if strings.Contains(line, a.s) {
				a.line <- line
			} else {
				waiting = append(waiting, a)
			}
		}
		o.awaits = waiting
	}
}
