package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/internal/testserver"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// binary is the idem command built for these tests.
var binary string

func TestMain(m *testing.M) {
	if os.Getenv("IDEM_TEST_HOLDER") != "" {
		os.Exit(runHolder())
	}
	dir, err := os.MkdirTemp("", "idem-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "idem")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building idem: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// The lease TTL of the handlers here: far longer than any test, so that a
// next delivery running at once proves the lease was released, not that it
// ran out.
const leaseTTL = 5 * time.Minute

// middlewareFor returns the middleware the holder and the tests run, on
// the store the IDEM_* environment names, in namespace ns.
func middlewareFor(ctx context.Context, ns string, counters *idempotency.Counters) (*idempotency.Idempotency, func(), error) {
	g := &globals{}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	g.register(fs)
	if err := g.validate(); err != nil {
		return nil, nil, err
	}
	store, _, closeFn, err := openStore(ctx, g, true)
	if err != nil {
		return nil, nil, err
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: ns, LeaseTTL: leaseTTL, Observer: counters})
	if err != nil {
		closeFn()
		return nil, nil, err
	}
	return idem, closeFn, nil
}

// runHolder is a consumer that takes the lease on message
// $IDEM_TEST_HOLDER in namespace "charge", says "holding TOKEN" and hangs
// until it is killed.
func runHolder() int {
	idem, _, err := middlewareFor(context.Background(), "charge", nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 1
	}
	_, err = idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		lease, _ := idempotency.LeaseFromContext(msg.Context())
		fmt.Printf("holding %d\n", lease.Token)
		select {}
	})(message.NewMessage(os.Getenv("IDEM_TEST_HOLDER"), nil))
	fmt.Fprintln(os.Stderr, "holder:", err)
	return 1
}

// target is a store the tests run the binary against.
type target struct {
	name string
	env  []string
}

func targets(t *testing.T) []target {
	prefix := testserver.Unique("idem-e2e-")
	schema := strings.NewReplacer("-", "_", ":", "").Replace(prefix)
	pgURL := testserver.PostgresURL()
	pool := testserver.PostgresPool(t)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
	cluster := testserver.StartRedisCluster(t, 3)
	return []target{
		{"redis", []string{"IDEM_STORE=redis", "IDEM_REDIS_URL=redis://" + testserver.Env("REDIS_ADDR", "127.0.0.1:6379") + "/0", "IDEM_REDIS_PREFIX=" + prefix}},
		{"redis-cluster", []string{"IDEM_STORE=redis", "IDEM_REDIS_CLUSTER=" + strings.Join(cluster, ","), "IDEM_REDIS_PREFIX=" + prefix}},
		{"postgres", []string{"IDEM_STORE=postgres", "IDEM_PG_URL=" + pgURL, "IDEM_PG_SCHEMA=" + schema}},
	}
}

// result is one run of the binary.
type result struct {
	stdout, stderr string
	code           int
}

func idem(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("idem %v: %v", args, err)
	}
	return result{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}

// ok runs the binary and fails the test unless it exits 0.
func ok(t *testing.T, env []string, args ...string) string {
	t.Helper()
	r := idem(t, env, "", args...)
	require.Equal(t, 0, r.code, "idem %v: %s%s", args, r.stdout, r.stderr)
	return r.stdout
}

func inspectJSON(t *testing.T, env []string, key string) recordView {
	t.Helper()
	var v recordView
	require.NoError(t, json.Unmarshal([]byte(ok(t, env, "inspect", key, "-o", "json")), &v))
	return v
}

// startHolder runs a holder process for uuid and returns it once it holds
// the lease, with the token it got.
func startHolder(t *testing.T, env []string, uuid string) (*exec.Cmd, string) {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(self)
	cmd.Env = append(append(os.Environ(), env...), "IDEM_TEST_HOLDER="+uuid)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr // the holder's errors show in the test's output
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case l := <-line:
		require.True(t, strings.HasPrefix(l, "holding "), "holder said %q", l)
		return cmd, l
	case <-time.After(time.Minute):
		t.Fatal("the holder did not take the lease")
		return nil, ""
	}
}

func TestIdemAgainstStores(t *testing.T) {
	for _, tg := range targets(t) {
		t.Run(tg.name, func(t *testing.T) {
			for _, kv := range tg.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			if tg.name == "postgres" {
				require.Contains(t, ok(t, tg.env, "pg", "migrate"), "is ready")
			}
			testLifecycle(t, tg.env)
			testListAndStats(t, tg.env)
		})
	}
}

// deliver runs one delivery of uuid in namespace ns, counting handler runs.
func deliver(t *testing.T, ns, uuid string, runs *atomic.Int32, counters *idempotency.Counters, fail bool) (backends.Lease, error) {
	t.Helper()
	idem, closeFn, err := middlewareFor(context.Background(), ns, counters)
	require.NoError(t, err)
	defer closeFn()
	var lease backends.Lease
	_, err = idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		lease, _ = idempotency.LeaseFromContext(msg.Context())
		if fail {
			return nil, errors.New("declined")
		}
		return nil, nil
	})(message.NewMessage(uuid, nil))
	return lease, err
}

func testLifecycle(t *testing.T, env []string) {
	// A missing key is exit code 2.
	r := idem(t, env, "", "inspect", "charge:nope")
	require.Equal(t, exitNotFound, r.code, r.stderr)
	require.Contains(t, r.stderr, "no record")

	// A holder killed mid-handler leaves its lease in progress, token 1.
	holder, said := startHolder(t, env, "order-1")
	require.Equal(t, "holding 1", said)
	require.NoError(t, holder.Process.Signal(syscall.SIGKILL))
	_ = holder.Wait()
	v := inspectJSON(t, env, "charge:order-1")
	require.Equal(t, "in_progress", v.State)
	require.EqualValues(t, 1, v.Token)
	require.NotNil(t, v.LeaseLeft)
	require.Greater(t, *v.LeaseLeft, (leaseTTL - time.Minute).Seconds(), "the lease has most of its TTL left")

	// Deleting a live lease needs --force; release lets the redelivery run
	// at once, with the next token.
	require.Equal(t, exitRefused, idem(t, env, "", "delete", "charge:order-1").code)
	require.Contains(t, ok(t, env, "release", "charge:order-1"), "released the lease of owner")
	require.Equal(t, exitRefused, idem(t, env, "", "release", "charge:order-1").code, "nothing left to release")
	var runs atomic.Int32
	start := time.Now()
	lease, err := deliver(t, "charge", "order-1", &runs, nil, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 2, lease.Token)
	require.Less(t, time.Since(start), leaseTTL/5, "well before the lease TTL")

	// complete: the next delivery is a duplicate; the handler does not run.
	require.Contains(t, ok(t, env, "complete", "charge:order-2"), "completed with token 1")
	_, err = deliver(t, "charge", "order-2", &runs, nil, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, runs.Load(), "order-2 was dropped")
	require.Contains(t, ok(t, env, "complete", "charge:order-2"), "already completed")

	// delete a completed key: the handler runs again, with the next token.
	require.Contains(t, ok(t, env, "delete", "charge:order-1"), "deleted (was completed, token 2)")
	lease, err = deliver(t, "charge", "order-1", &runs, nil, false)
	require.NoError(t, err)
	require.EqualValues(t, 2, runs.Load(), "order-1 ran again")
	require.EqualValues(t, 1, lease.Token, "a deleted record starts over")

	// A live lease: complete and delete refuse without --force.
	holder, _ = startHolder(t, env, "order-3")
	defer holder.Process.Kill() //nolint:errcheck
	require.Equal(t, exitRefused, idem(t, env, "", "complete", "charge:order-3").code)
	require.Contains(t, ok(t, env, "complete", "charge:order-3", "--force"), "completed with token 2")
	require.Equal(t, "completed", inspectJSON(t, env, "charge:order-3").State)
	require.Equal(t, exitNotFound, idem(t, env, "", "delete", "charge:nope").code)

	// inspect decodes the output a duplicate would replay.
	idemMW, closeFn, err := middlewareFor(context.Background(), "charge", nil)
	require.NoError(t, err)
	_, err = idemMW.Middleware(func(*message.Message) ([]*message.Message, error) {
		receipt := message.NewMessage("receipt-9", []byte("paid"))
		receipt.Metadata.Set("order", "order-9")
		return []*message.Message{receipt}, nil
	})(message.NewMessage("order-9", nil))
	closeFn()
	require.NoError(t, err)
	v = inspectJSON(t, env, "charge:order-9")
	require.Equal(t, []outputView{{UUID: "receipt-9", Metadata: map[string]string{"order": "order-9"}, PayloadBytes: 4}}, v.Output)
	require.Contains(t, ok(t, env, "inspect", "charge:order-9"), `uuid receipt-9, 4 payload bytes, metadata {order="order-9"}`)

	// key: the key the middleware computes, and its record.
	payload := `{"order_id":"order-2","amount":"10.00"}`
	r = idem(t, env, payload, "key", "--json-field", "order_id", "--namespace", "charge")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "charge:order-2\n", r.stdout)
	r = idem(t, env, payload, "key", "--json-field", "order_id", "--namespace", "charge", "--inspect", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `"state":"completed"`)
}

func testListAndStats(t *testing.T, env []string) {
	// Five keys, paged two at a time: each exactly once, in key order.
	var runs atomic.Int32
	for i := range 5 {
		_, err := deliver(t, "page", fmt.Sprintf("k%d", i), &runs, nil, false)
		require.NoError(t, err)
	}
	var keys []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		args := []string{"list", "--namespace", "page", "--limit", "2", "-o", "json"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		var page struct {
			Records []recordView `json:"records"`
			Cursor  string       `json:"cursor"`
		}
		require.NoError(t, json.Unmarshal([]byte(ok(t, env, args...)), &page))
		require.LessOrEqual(t, len(page.Records), 2)
		for _, r := range page.Records {
			keys = append(keys, r.Key)
		}
		if cursor = page.Cursor; cursor == "" {
			break
		}
	}
	require.Equal(t, []string{"page:k0", "page:k1", "page:k2", "page:k3", "page:k4"}, keys)
	require.Contains(t, ok(t, env, "list", "--namespace", "page", "--limit", "2"), "more: --cursor")
	require.Equal(t, exitError, idem(t, env, "", "list", "--namespace", "page", "--cursor", "not a cursor").code)

	// stats agrees with the middleware's counters.
	counters := &idempotency.Counters{}
	for i := range 6 {
		_, _ = deliver(t, "stats", fmt.Sprintf("s%d", i%4), &runs, counters, i == 5)
	}
	var stats map[string]int64
	require.NoError(t, json.Unmarshal([]byte(ok(t, env, "stats", "--namespace", "stats", "-o", "json")), &stats))
	require.Equal(t, counters.Count(idempotency.OutcomeProcessed), stats["completed"], "%v %v", stats, counters.Snapshot())
	require.EqualValues(t, 4, stats["total"])
	require.EqualValues(t, 0, stats["in_progress"]+stats["released"]+stats["expired"])
}

// The key command needs no store.
func TestKeyWithoutStore(t *testing.T) {
	env := []string{"IDEM_REDIS_URL=redis://127.0.0.1:1/0"} // nothing listens there
	for _, c := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{`{"order":{"id":"o-7"}}`, []string{"--json-field", "order.id", "--namespace", "billing"}, "billing:o-7"},
		{"", []string{"--metadata", "order_id", "--set", "order_id=o-8"}, "o-8"},
		{"", []string{"--uuid", "--message-uuid", "m-1", "--namespace", "h"}, "h:m-1"},
		{"abc", []string{"--payload-hash"}, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
	} {
		r := idem(t, env, c.stdin, append([]string{"key"}, c.args...)...)
		require.Equal(t, 0, r.code, r.stderr)
		require.Equal(t, c.want+"\n", r.stdout)
	}
	r := idem(t, env, `{"amount":1}`, "key", "--json-field", "order_id")
	require.Equal(t, exitError, r.code)
	require.Contains(t, r.stderr, "no key")
	r = idem(t, env, `{`, "key", "--json-field", "order_id")
	require.Equal(t, exitError, r.code, "malformed JSON")
	require.Equal(t, exitError, idem(t, env, "", "key").code, "no extractor")
}

// Bad URLs, unreachable stores and a wrong table get clear errors.
func TestIdemErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"bad redis URL", []string{"IDEM_REDIS_URL=http://x"}, []string{"inspect", "k"}, "--redis-url"},
		{"unreachable redis", []string{"IDEM_REDIS_URL=redis://127.0.0.1:1/0"}, []string{"inspect", "k"}, "Redis at 127.0.0.1:1 does not answer"},
		{"bad postgres URL", []string{"IDEM_PG_URL=postgres://%zz"}, []string{"stats"}, "--pg-url"},
		{"unreachable postgres", []string{"IDEM_PG_URL=postgres://postgres@127.0.0.1:1/test?connect_timeout=2"}, []string{"stats"}, "does not answer"},
		{"wrong table", []string{"IDEM_PG_URL=" + testserver.PostgresURL(), "IDEM_PG_TABLE=no_such_table"}, []string{"stats"}, `has no table "public"."no_such_table"`},
		{"unknown store", []string{"IDEM_STORE=mongo"}, []string{"stats"}, "--store must be redis or postgres"},
		{"unknown command", nil, []string{"frobnicate"}, "unknown command"},
		{"bad output", nil, []string{"stats", "-o", "yaml"}, "-o must be table or json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := idem(t, append([]string{"IDEM_STORE=", "IDEM_PG_URL=", "IDEM_REDIS_CLUSTER="}, c.env...), "", c.args...)
			require.Equal(t, exitError, r.code, r.stdout+r.stderr)
			require.Contains(t, r.stderr, c.want)
		})
	}
}

// pg schema prints SQL that creates a working table, for migration tools.
func TestPgSchemaCreatesTheTable(t *testing.T) {
	schema := strings.NewReplacer("-", "_", ":", "").Replace(testserver.Unique("idem_schema_"))
	env := []string{"IDEM_PG_URL=" + testserver.PostgresURL(), "IDEM_PG_SCHEMA=" + schema, "IDEM_STORE="}
	sql := ok(t, env, "pg", "schema")
	require.NotContains(t, sql, "{{")
	require.NotContains(t, sql, "snippet")
	pool, err := pgxpool.New(context.Background(), testserver.PostgresURL())
	require.NoError(t, err)
	defer pool.Close()
	defer pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) //nolint:errcheck
	_, err = pool.Exec(context.Background(), sql)
	require.NoError(t, err)
	require.Contains(t, ok(t, env, "stats"), "total       0")
	require.Contains(t, ok(t, env, "pg", "cleanup"), "deleted 0 forgotten records")
}
