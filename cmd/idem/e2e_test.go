package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// idemBinary is the idem command built for these tests.
var idemBinary string

func TestMain(m *testing.M) {
	if os.Getenv("IDEM_TEST_HOLDER") != "" {
		os.Exit(runHolder())
	}
	dir, err := os.MkdirTemp("", "idem-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	idemBinary = filepath.Join(dir, "idem")
	if out, err := exec.Command("go", "build", "-o", idemBinary, ".").CombinedOutput(); err != nil {
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
	if err := fromEnv(fs); err != nil {
		return nil, nil, err
	}
	if err := g.validate(); err != nil {
		return nil, nil, err
	}
	store, closeFn, err := openStore(ctx, g, true)
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
	// setup creates the store's table, if it has one.
	setup []string
}

func targets(t *testing.T) []target {
	prefix := unique("idem-e2e-")
	schema := strings.NewReplacer("-", "_", ":", "").Replace(prefix)
	pgURL := service(t, "TEST_DATABASE_URL")
	pool, err := pgxpool.New(context.Background(), pgURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
	table, _ := mysqlTable(t)
	return []target{
		{"redis", []string{"IDEM_STORE=redis", "IDEM_REDIS_URL=redis://" + service(t, "REDIS_ADDR") + "/0", "IDEM_REDIS_PREFIX=" + prefix}, nil},
		{"redis-cluster", []string{"IDEM_STORE=redis", "IDEM_REDIS_CLUSTER=" + service(t, "REDIS_CLUSTER_ADDRS"), "IDEM_REDIS_PREFIX=" + prefix}, nil},
		{"postgres", []string{"IDEM_STORE=postgres", "IDEM_PG_URL=" + pgURL, "IDEM_PG_SCHEMA=" + schema}, []string{"pg", "migrate"}},
		{"mysql", []string{"IDEM_STORE=mysql", "IDEM_MYSQL_DSN=" + mysqlDSN(t), "IDEM_MYSQL_TABLE=" + table}, []string{"mysql", "migrate"}},
		// dynalite has no Time to Live.
		{"dynamodb", dynamoEnv(t), []string{"dynamodb", "migrate", "--ttl", "untouched"}},
	}
}

// mysqlDSN is the test database, $MYSQL_DSN.
func mysqlDSN(t testing.TB) string { return service(t, "MYSQL_DSN") }

// mysqlTable returns a table name of the test's own in the test database,
// dropped when the test ends, and a connection to that database. It fails
// the test if the database does not answer.
func mysqlTable(t *testing.T) (string, *sql.DB) {
	t.Helper()
	db, err := sql.Open("mysql", mysqlDSN(t))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, db.PingContext(ctx), "MariaDB or MySQL at MYSQL_DSN (%s)", redactValue("mysql-dsn", mysqlDSN(t)))
	table := strings.NewReplacer("-", "_", ":", "").Replace(unique("idem_e2e_"))
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+table+"`")
		db.Close()
	})
	return table, db
}

// dynamoEnv returns the environment that points idem at a table of the
// test's own on the DynamoDB at $DYNAMODB_ENDPOINT, signed with the static
// credentials emulators accept. The table is deleted when the test ends.
func dynamoEnv(t *testing.T) []string {
	t.Helper()
	endpoint := service(t, "DYNAMODB_ENDPOINT")
	table := strings.ReplaceAll(unique("idem-e2e-"), ":", "")
	t.Cleanup(func() {
		_, _ = dynamoClient(t).DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	return []string{
		"IDEM_STORE=dynamodb", "IDEM_DYNAMO_ENDPOINT=" + endpoint, "IDEM_DYNAMO_TABLE=" + table,
		"AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test",
	}
}

// dynamoClient is a client of the DynamoDB at $DYNAMODB_ENDPOINT, signed
// with the static credentials emulators accept.
func dynamoClient(t testing.TB) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{Region: "us-east-1", BaseEndpoint: aws.String(service(t, "DYNAMODB_ENDPOINT")),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		})})
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
	cmd := exec.CommandContext(ctx, idemBinary, args...)
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
			if tg.setup != nil {
				require.Contains(t, ok(t, tg.env, tg.setup...), "is ready")
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
	r = idem(t, env, "", "release", "charge:order-1", "-o", "json")
	require.Equal(t, exitRefused, r.code, "nothing left to release")
	require.Equal(t, actionNoLease, actionOf(t, r.stdout))
	var runs atomic.Int32
	start := time.Now()
	lease, err := deliver(t, "charge", "order-1", &runs, nil, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 2, lease.Token)
	require.Less(t, time.Since(start), leaseTTL/5, "well before the lease TTL")

	// complete needs a record unless --create: the next delivery is then a
	// duplicate; the handler does not run.
	r = idem(t, env, "", "complete", "charge:order-2")
	require.Equal(t, exitNotFound, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, `"charge:order-2" has no record, so nothing to complete: --create`)
	r = idem(t, env, "", "complete", "charge:order-2", "-o", "json")
	require.Equal(t, exitNotFound, r.code, r.stdout+r.stderr)
	require.Equal(t, actionNotFound, actionOf(t, r.stdout))
	require.Equal(t, exitNotFound, idem(t, env, "", "inspect", "charge:order-2").code, "a failed complete creates no record")
	r = idem(t, env, "", "complete", "charge:order-2", "--create", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, actionCompleted, actionOf(t, r.stdout))
	require.Contains(t, r.stdout, `"message":"completed with token 1: the next delivery is dropped"`)
	_, err = deliver(t, "charge", "order-2", &runs, nil, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, runs.Load(), "order-2 was dropped")
	require.Contains(t, ok(t, env, "complete", "charge:order-2"), "already completed")
	require.Equal(t, actionAlreadyCompleted, actionOf(t, ok(t, env, "complete", "charge:order-2", "-o", "json")))

	// delete a completed key: the handler runs again, with the next token.
	r = idem(t, env, "", "delete", "charge:order-1", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, actionDeleted, actionOf(t, r.stdout))
	require.Contains(t, r.stdout, `"message":"deleted (was completed, token 2): the next delivery runs"`)
	lease, err = deliver(t, "charge", "order-1", &runs, nil, false)
	require.NoError(t, err)
	require.EqualValues(t, 2, runs.Load(), "order-1 ran again")
	require.EqualValues(t, 1, lease.Token, "a deleted record starts over")

	// A live lease: complete and delete refuse without --force.
	holder, _ = startHolder(t, env, "order-3")
	defer holder.Process.Kill() //nolint:errcheck
	r = idem(t, env, "", "complete", "charge:order-3", "-o", "json")
	require.Equal(t, exitRefused, r.code, r.stdout+r.stderr)
	require.Equal(t, actionInProgress, actionOf(t, r.stdout))
	require.Contains(t, ok(t, env, "complete", "charge:order-3", "--force"), "completed with token 2")
	require.Equal(t, "completed", inspectJSON(t, env, "charge:order-3").State)
	r = idem(t, env, "", "delete", "charge:nope", "-o", "json")
	require.Equal(t, exitNotFound, r.code)
	require.Equal(t, actionNotFound, actionOf(t, r.stdout))

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
	require.Equal(t, outputMessages, v.OutputKind)
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
	// A namespace mistyped: the counts are zero, and a line on stderr
	// names the namespaces that have records, read with one page of List
	// over every namespace.
	r := idem(t, env, "", "stats", "--namespace", "pag")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "total       0")
	requireOneLine(t, r.stderr)
	require.Contains(t, r.stderr, `idem: namespace "pag" has no records (did you mean --namespace page?); the namespaces with records: "charge", "page"`)
	require.Contains(t, ok(t, env, "list", "--namespace", "page", "--limit", "2"), "more: --cursor")
	// A cursor no page of the namespace printed is a usage error, not an
	// empty page.
	for _, c := range [][]string{
		{"--cursor", "not a cursor"},
		{"--cursor", "notacursor"},
		{"--cursor", "notacursor", "--namespace", "page"},
		{"--cursor", storekit.ListCursor("stats:s1"), "--namespace", "page"},
	} {
		r := idem(t, env, "", append([]string{"list"}, c...)...)
		require.Equal(t, exitError, r.code, "%v: %s%s", c, r.stdout, r.stderr)
		require.Contains(t, r.stderr, fmt.Sprintf("--cursor %q is not a cursor", c[1]))
		require.Empty(t, r.stdout)
	}

	// stats agrees with the middleware's counters: four fresh keys
	// processed (completed), one fresh key whose handler fails (its lease
	// released), a duplicate that adds no record, and a holder blocked in
	// its handler, so that one record is in progress when stats runs.
	counters := &idempotency.Counters{}
	var statsRuns atomic.Int32
	for i := range 4 {
		_, err := deliver(t, "stats", fmt.Sprintf("s%d", i), &statsRuns, counters, false)
		require.NoError(t, err)
	}
	_, err := deliver(t, "stats", "declined", &statsRuns, counters, true)
	require.Error(t, err, "the handler failed")
	_, err = deliver(t, "stats", "s0", &statsRuns, counters, false)
	require.NoError(t, err)
	finish, held := holdInHandler(t, "stats", "held", &statsRuns, counters)
	require.Equal(t, map[string]int64{"processed": 4, "handler_failed": 1, "duplicate": 1}, counters.Snapshot())

	// A record is in progress while its handler runs: the handlers
	// started and not yet observed.
	fromCounters := func() map[string]int64 {
		completed := counters.Count(idempotency.OutcomeProcessed)
		released := counters.Count(idempotency.OutcomeHandlerFailed)
		inProgress := int64(statsRuns.Load()) - completed - released
		return map[string]int64{
			"completed": completed, "released": released, "in_progress": inProgress,
			// No lease here runs out: leaseTTL outlasts the test.
			"expired": 0,
			"total":   completed + released + inProgress,
		}
	}
	var oldest *time.Time
	stats := func() map[string]int64 {
		t.Helper()
		var got map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(ok(t, env, "stats", "--namespace", "stats", "-o", "json")), &got))
		counts := map[string]int64{}
		for k, v := range got {
			if k == "oldest_in_progress" {
				oldest = nil
				require.NoError(t, json.Unmarshal(v, &oldest))
				continue
			}
			var n int64
			require.NoError(t, json.Unmarshal(v, &n), k)
			counts[k] = n
		}
		return counts
	}
	want := fromCounters()
	require.Equal(t, map[string]int64{"completed": 4, "released": 1, "in_progress": 1, "expired": 0, "total": 6}, want)
	require.Equal(t, want, stats(), "counters %v", counters.Snapshot())
	// The held lease is the oldest in progress: acquired when the held
	// delivery took it, as its record says.
	var rec struct {
		AcquiredAt time.Time `json:"acquired_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(ok(t, env, "inspect", "stats:held", "-o", "json")), &rec))
	require.NotNil(t, oldest, "the held lease is in progress")
	require.True(t, oldest.Equal(rec.AcquiredAt), "oldest in progress %v, the held record acquired at %v", oldest, rec.AcquiredAt)
	require.Contains(t, ok(t, env, "stats", "--namespace", "stats"), "oldest in progress acquired ")

	// Once the held handler returns, its record is completed.
	close(finish)
	require.NoError(t, <-held)
	want = fromCounters()
	require.Equal(t, map[string]int64{"completed": 5, "released": 1, "in_progress": 0, "expired": 0, "total": 6}, want)
	require.Equal(t, want, stats(), "counters %v", counters.Snapshot())
	require.Nil(t, oldest, "no lease in progress")
	require.Contains(t, ok(t, env, "stats", "--namespace", "stats"), "oldest in progress acquired -\n")
}

// holdInHandler starts a delivery of uuid in namespace ns whose handler
// runs once it holds the lease and then blocks until finish is closed; it
// returns once the handler runs. held yields the delivery's error. The
// delivery is let go and waited for at cleanup if the test has not done so.
func holdInHandler(t *testing.T, ns, uuid string, runs *atomic.Int32, counters *idempotency.Counters) (finish chan struct{}, held <-chan error) {
	t.Helper()
	idemMW, closeFn, err := middlewareFor(context.Background(), ns, counters)
	require.NoError(t, err)
	finish = make(chan struct{})
	started := make(chan struct{})
	result := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := idemMW.Middleware(func(*message.Message) ([]*message.Message, error) {
			runs.Add(1)
			close(started)
			<-finish
			return nil, nil
		})(message.NewMessage(uuid, nil))
		result <- err
	}()
	t.Cleanup(func() {
		select {
		case <-finish:
		default:
			close(finish)
		}
		<-done
		closeFn()
	})
	select {
	case <-started:
	case err := <-result:
		t.Fatalf("the handler of %s did not run: %v", uuid, err)
	case <-time.After(time.Minute):
		t.Fatalf("the handler of %s did not start", uuid)
	}
	return finish, result
}

// A Redis prefix given without the colon that ends it finds no record of
// a namespace: idem says why.
func TestRedisPrefixWithoutItsColon(t *testing.T) {
	prefix := unique("idem-prefix-")
	env := append(noStore, "IDEM_REDIS_URL=redis://"+service(t, "REDIS_ADDR")+"/0", "IDEM_REDIS_PREFIX="+prefix)
	ok(t, env, "complete", "billing:k1", "--create")
	r := idem(t, env, "", "stats", "--namespace", "billing", "--redis-prefix", strings.TrimSuffix(prefix, ":"))
	require.Equal(t, exitOK, r.code, r.stderr)
	requireOneLine(t, r.stderr)
	require.Contains(t, r.stderr, `namespace "billing" has no records; the keys found start with a colon (":billing:k1"); --redis-prefix "`+
		strings.TrimSuffix(prefix, ":")+`" does not end with a colon`)
	r = idem(t, env, "", "stats", "--redis-prefix", prefix+"other:")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, `has no records under the key prefix "`+prefix+`other:" (--redis-prefix)`)
}

// The key command needs no store.
func TestKeyWithoutStore(t *testing.T) {
	env := []string{"IDEM_REDIS_URL=redis://127.0.0.1:1/0"} // nothing listens there
	for _, c := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{`{"order":{"id":"o-7"}}`, []string{"--json-field", "order", "--json-field", "id", "--namespace", "billing"}, "billing:o-7"},
		{"", []string{"--metadata", "order_id", "--set", "order_id=o-8", "--namespace", "h"}, "h:o-8"},
		{"", []string{"--uuid", "--message-uuid", "m-1", "--namespace", "h"}, "h:m-1"},
		{"abc", []string{"--payload-hash", "--namespace", "h"}, "h:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
	} {
		r := idem(t, env, c.stdin, append([]string{"key"}, c.args...)...)
		require.Equal(t, 0, r.code, r.stderr)
		require.Equal(t, c.want+"\n", r.stdout)
	}
	r := idem(t, env, `{"amount":1}`, "key", "--json-field", "order_id", "--namespace", "h")
	require.Equal(t, exitError, r.code)
	require.Contains(t, r.stderr, "no key")
	r = idem(t, env, `{`, "key", "--json-field", "order_id", "--namespace", "h")
	require.Equal(t, exitError, r.code, "malformed JSON")
	require.Equal(t, exitError, idem(t, env, "", "key", "--namespace", "h").code, "no extractor")
}

// Bad URLs, unreachable stores and a wrong table get clear errors, and
// never a password.
func TestIdemErrors(t *testing.T) {
	dsn, err := mysql.ParseDSN(mysqlDSN(t))
	require.NoError(t, err)
	wrongPassword := *dsn
	wrongPassword.Passwd = "s3cret"
	noDatabase := *dsn
	noDatabase.DBName = ""
	dynalite := dynamoEnv(t)
	dynamo := func(extra ...string) []string { return append(slices.Clip(dynalite), extra...) }
	noAWS := []string{"AWS_REGION=", "AWS_DEFAULT_REGION=", "AWS_PROFILE=", "AWS_CONFIG_FILE=" + filepath.Join(t.TempDir(), "none")}
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
		// hide must not be printed.
		hide string
	}{
		{"bad redis URL", []string{"IDEM_REDIS_URL=http://x"}, []string{"inspect", "k"}, "--redis-url", ""},
		{"bad IDEM_TIMEOUT", []string{"IDEM_TIMEOUT=ten seconds"}, []string{"inspect", "k"}, "IDEM_TIMEOUT", ""},
		{"bad IDEM_DYNAMO_CLOCK_SKEW", []string{"IDEM_STORE=dynamodb", "IDEM_DYNAMO_CLOCK_SKEW=1 second"}, []string{"inspect", "k"}, "IDEM_DYNAMO_CLOCK_SKEW", ""},
		{"unreachable redis", []string{"IDEM_REDIS_URL=redis://127.0.0.1:1/0"}, []string{"inspect", "k"}, "Redis at 127.0.0.1:1 does not answer", ""},
		{"bad postgres URL", []string{"IDEM_PG_URL=postgres://%zz"}, []string{"stats"}, "--pg-url", ""},
		{"unreachable postgres", []string{"IDEM_PG_URL=postgres://postgres@127.0.0.1:1/test?connect_timeout=2"}, []string{"stats"}, "does not answer", ""},
		{"wrong table", []string{"IDEM_PG_URL=" + service(t, "TEST_DATABASE_URL"), "IDEM_PG_TABLE=no_such_table"}, []string{"stats"}, `has no table "public"."no_such_table"`, ""},
		{"no mysql DSN", []string{"IDEM_STORE=mysql"}, []string{"stats"}, "--mysql-dsn (IDEM_MYSQL_DSN) is required", ""},
		{"bad mysql DSN", []string{"IDEM_MYSQL_DSN=app:s3cret@tcp(127.0.0.1:3306"}, []string{"stats"}, `--mysql-dsn "app:xxxxx@tcp(127.0.0.1:3306": invalid DSN`, "s3cret"},
		{"unreachable mysql", []string{"IDEM_MYSQL_DSN=app:s3cret@tcp(127.0.0.1:1)/test"}, []string{"stats"}, "MySQL at 127.0.0.1:1 does not answer", "s3cret"},
		{"wrong mysql password", []string{"IDEM_MYSQL_DSN=" + wrongPassword.FormatDSN()}, []string{"stats"}, "MySQL at " + dsn.Addr + ` answered with an error: "Error 1045`, "s3cret"},
		{"mysql DSN without a database", []string{"IDEM_MYSQL_DSN=" + noDatabase.FormatDSN()}, []string{"stats"}, "the DSN names no database", ""},
		{"wrong mysql table", []string{"IDEM_MYSQL_DSN=" + mysqlDSN(t), "IDEM_MYSQL_TABLE=no_such_table"}, []string{"stats"}, "has no table `" + dsn.DBName + "`.`no_such_table`: check --mysql-table and the DSN's database, or create it with `idem mysql migrate`", ""},
		{"wrong dynamodb table", dynamo("IDEM_DYNAMO_TABLE=no_such_table"), []string{"stats"}, "has no table no_such_table: check --dynamo-table and the region, or create it with `idem dynamodb migrate`", ""},
		{"unreachable dynamodb", dynamo("IDEM_DYNAMO_ENDPOINT=http://127.0.0.1:1"), []string{"stats"}, "DynamoDB at http://127.0.0.1:1 does not answer", ""},
		{"bad dynamodb endpoint", dynamo("IDEM_DYNAMO_ENDPOINT=ftp://x"), []string{"stats"}, `--dynamo-endpoint "ftp://x": want http://host:port`, ""},
		{"no AWS region", append([]string{"IDEM_STORE=dynamodb"}, noAWS...), []string{"stats"}, "no AWS region for the dynamodb store: set AWS_REGION", ""},
		{"two SQL stores", []string{"IDEM_PG_URL=" + service(t, "TEST_DATABASE_URL"), "IDEM_MYSQL_DSN=" + mysqlDSN(t)}, []string{"stats"}, "choose the store with --store", ""},
		{"unknown store", []string{"IDEM_STORE=mongo"}, []string{"stats"}, "--store must be redis, postgres, mysql or dynamodb", ""},
		{"unknown command", nil, []string{"frobnicate"}, "unknown command", ""},
		{"redis URL without a scheme", []string{"IDEM_REDIS_URL=127.0.0.1:6379"}, []string{"inspect", "k"}, `--redis-url "127.0.0.1:6379" has no scheme: want a URL such as "redis://127.0.0.1:6379"`, ""},
		{"postgres URL without a scheme", []string{"IDEM_PG_URL=db.internal:5432/app"}, []string{"stats"}, `--pg-url "db.internal:5432/app" has no scheme: want a URL such as "postgres://db.internal:5432/app"`, ""},
		{"mysql DSN as a URL", []string{"IDEM_MYSQL_DSN=mysql://app@db.internal:3306/shop"}, []string{"stats"}, `here "app@tcp(db.internal:3306)/shop"`, ""},
		{"dynamodb endpoint without a scheme", dynamo("IDEM_DYNAMO_ENDPOINT=127.0.0.1:8000"), []string{"stats"}, `--dynamo-endpoint "127.0.0.1:8000" has no scheme: want a URL such as "http://127.0.0.1:8000"`, ""},
		{"bad output", nil, []string{"stats", "-o", "yaml"}, "-o must be table or json", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := idem(t, append([]string{"IDEM_STORE=", "IDEM_PG_URL=", "IDEM_REDIS_CLUSTER=", "IDEM_MYSQL_DSN=", "IDEM_DYNAMO_ENDPOINT="}, c.env...), "", c.args...)
			require.Equal(t, exitError, r.code, r.stdout+r.stderr)
			require.Contains(t, r.stderr, c.want)
			requireOneLine(t, r.stderr)
			if c.hide != "" {
				require.NotContains(t, r.stdout+r.stderr, c.hide)
			}
		})
	}
}

// pg schema prints SQL that creates a working table, for migration tools.
func TestPgSchemaCreatesTheTable(t *testing.T) {
	schema := strings.NewReplacer("-", "_", ":", "").Replace(unique("idem_schema_"))
	env := []string{"IDEM_PG_URL=" + service(t, "TEST_DATABASE_URL"), "IDEM_PG_SCHEMA=" + schema, "IDEM_STORE="}
	sql := ok(t, env, "pg", "schema")
	require.NotContains(t, sql, "{{")
	require.NotContains(t, sql, "snippet")
	pool, err := pgxpool.New(context.Background(), service(t, "TEST_DATABASE_URL"))
	require.NoError(t, err)
	defer pool.Close()
	defer pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) //nolint:errcheck
	_, err = pool.Exec(context.Background(), sql)
	require.NoError(t, err)
	require.Contains(t, ok(t, env, "stats"), "total       0")
	require.Contains(t, ok(t, env, "pg", "cleanup"), "deleted 0 forgotten records")
}

// mysql schema prints SQL that creates a working table, for migration
// tools; it needs no DSN, and --store does not change it.
func TestMySQLSchemaCreatesTheTable(t *testing.T) {
	table, db := mysqlTable(t)
	sql := ok(t, []string{"IDEM_STORE=redis", "IDEM_PG_URL=" + service(t, "TEST_DATABASE_URL"), "IDEM_MYSQL_DSN=", "IDEM_MYSQL_TABLE=" + table}, "mysql", "schema")
	require.Contains(t, sql, "CREATE TABLE IF NOT EXISTS `"+table+"`")
	require.NotContains(t, sql, "{{")
	_, err := db.ExecContext(context.Background(), sql)
	require.NoError(t, err)
	env := []string{"IDEM_STORE=", "IDEM_PG_URL=", "IDEM_MYSQL_DSN=" + mysqlDSN(t), "IDEM_MYSQL_TABLE=" + table}
	require.Contains(t, ok(t, env, "stats"), "total       0")
	require.Contains(t, ok(t, env, "mysql", "migrate"), "table "+table+" is ready")
	require.Contains(t, ok(t, env, "mysql", "cleanup"), "deleted 0 forgotten records")
	require.Equal(t, exitError, idem(t, env, "", "mysql", "cleanup", "--batch", "0").code)
}

// dynamodb migrate waits for the table to become active, which takes
// longer on DynamoDB than the other commands take: its default --timeout
// is longer.
func TestDynamoMigrateTimeout(t *testing.T) {
	r := idem(t, []string{"IDEM_TIMEOUT="}, "", "dynamodb", "-h")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stderr, "(default 2m0s)")
	r = idem(t, []string{"IDEM_TIMEOUT="}, "", "stats", "-h")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stderr, "(default 10s)")
}
