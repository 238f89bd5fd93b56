package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// The tests in this file run idem in process, on a memstore when they need
// a store.

// cleanEnv unsets every IDEM_* variable of a flag for the test, so that
// the user's own settings do not change what the commands do.
func cleanEnv(t *testing.T) {
	t.Helper()
	for _, cmd := range commands {
		fs, _, _, err := newFlagSet(cmd, io.Discard)
		require.NoError(t, err)
		fs.VisitAll(func(f *flag.Flag) { t.Setenv(envVar(f.Name), "") })
	}
}

// runOn runs the command line in process as the binary would, with store
// as the store the flags name (nil for commands that need none).
func runOn(t *testing.T, store operatorStore, stdin string, args ...string) result {
	t.Helper()
	saved := storeOpener
	t.Cleanup(func() { storeOpener = saved })
	storeOpener = func(_ context.Context, g *globals, _ bool) (operatorStore, func(), error) {
		require.NotNil(t, store, "idem %v opened a store", args)
		g.where = "the test's store"
		return store, func() {}, nil
	}
	var stdout, stderr bytes.Buffer
	code := run(args, strings.NewReader(stdin), &stdout, &stderr)
	return result{stdout.String(), stderr.String(), code}
}

// requireOneLine fails the test unless stderr is exactly one line of idem's.
func requireOneLine(t *testing.T, stderr string) {
	t.Helper()
	require.Equal(t, 1, strings.Count(stderr, "\n"), "one line per failure, got:\n%s", stderr)
	require.True(t, strings.HasPrefix(stderr, "idem: "), "the line is idem's: %q", stderr)
}

// actionOf returns the action of a command's JSON output.
func actionOf(t *testing.T, stdout string) string {
	t.Helper()
	var v actionView
	require.NoError(t, json.Unmarshal([]byte(stdout), &v), "stdout %q", stdout)
	return v.Action
}

// racyStore is a real store on which, once, another holder acts right
// after idem inspected a key: what idem finds has changed by its next call.
type racyStore struct {
	operatorStore
	afterInspect func()
}

func (s *racyStore) Inspect(ctx context.Context, key string) (backends.Record, error) {
	rec, err := s.operatorStore.Inspect(ctx, key)
	if f := s.afterInspect; f != nil {
		s.afterInspect = nil
		f()
	}
	return rec, err
}

// Every action of the JSON output, each with its exit code and its one
// line on stderr when the command did not do what it was asked.
func TestActions(t *testing.T) {
	cleanEnv(t)
	ctx := context.Background()
	mem := newMemstore()
	store := &racyStore{operatorStore: mem}
	seen := map[string]bool{}
	step := func(code int, action string, args ...string) actionView {
		t.Helper()
		r := runOn(t, store, "", append(args, "-o", "json")...)
		require.Equal(t, code, r.code, "idem %v: %s%s", args, r.stdout, r.stderr)
		var v actionView
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &v), "stdout %q", r.stdout)
		require.Equal(t, action, v.Action, "idem %v", args)
		require.Equal(t, args[1], v.Key)
		require.NotEmpty(t, v.Message)
		if code == exitOK {
			require.Empty(t, r.stderr)
		} else {
			requireOneLine(t, r.stderr)
		}
		seen[v.Action] = true
		return v
	}

	step(exitNotFound, "not_found", "complete", "charge:k1")
	v := step(exitOK, "completed", "complete", "charge:k1", "--create")
	require.NotNil(t, v.Record)
	require.Equal(t, "completed", v.Record.State)
	step(exitOK, "already_completed", "complete", "charge:k1")
	step(exitRefused, "no_lease", "release", "charge:k1")
	step(exitOK, "deleted", "delete", "charge:k1")
	step(exitNotFound, "not_found", "delete", "charge:k1")
	step(exitNotFound, "not_found", "release", "charge:k1")

	// A live lease: complete and delete need --force.
	res, err := mem.Acquire(ctx, backends.AcquireRequest{Key: "charge:k2", Owner: "worker-1", LeaseTTL: time.Hour, Retention: time.Hour})
	require.NoError(t, err)
	step(exitRefused, "in_progress", "complete", "charge:k2")
	step(exitRefused, "in_progress", "delete", "charge:k2")

	// Another holder takes the key over between idem's inspect and its
	// release: idem releases nothing.
	store.afterInspect = func() {
		require.NoError(t, mem.Release(ctx, res.Lease))
		_, err := mem.Acquire(ctx, backends.AcquireRequest{Key: "charge:k2", Owner: "worker-2", LeaseTTL: time.Hour, Retention: time.Hour})
		require.NoError(t, err)
	}
	step(exitRefused, "changed", "release", "charge:k2")
	rec, err := mem.Inspect(ctx, "charge:k2")
	require.NoError(t, err)
	require.Equal(t, "worker-2", rec.Owner, "worker-2's lease stands")
	v = step(exitOK, "released", "release", "charge:k2")
	require.Contains(t, v.Message, "owner worker-2, token 2")

	require.ElementsMatch(t, actions, slices.Collect(maps.Keys(seen)), "every action, and only those listed")
	guide := idemGuide(t)
	for _, action := range actions {
		require.True(t, strings.Contains(guide, "| `"+action+"` |"), "docs/operations.md lists the action %s", action)
	}

	// As text: the prose, and the refusal on stderr.
	r := runOn(t, store, "", "complete", "charge:k3", "--create")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Equal(t, "\"charge:k3\": completed with token 1: the next delivery is dropped\n", r.stdout)
	r = runOn(t, store, "", "complete", "charge:k4")
	require.Equal(t, exitNotFound, r.code)
	require.Empty(t, r.stdout)
	require.Equal(t, "idem: \"charge:k4\" has no record, so nothing to complete: --create to record it as completed\n", r.stderr)
	_, err = mem.Inspect(ctx, "charge:k4")
	require.ErrorIs(t, err, backends.ErrNotFound, "complete without --create creates no record")

	// --create takes the full key only.
	r = runOn(t, store, "", "complete", "k5", "--create")
	require.Equal(t, exitError, r.code)
	require.Contains(t, r.stderr, `"k5" has no namespace`)
}

// The key idem prints is the key the middleware stores, for every JSON
// path: idem builds the extractor with keyfunc.JSONField from the names it
// is given, one --json-field per level, taken literally as JSONField takes
// them.
func TestKeyIsTheMiddlewaresKey(t *testing.T) {
	cleanEnv(t)
	payload := `{"order":{"id":"o-7","x|y":{"z":"piped"}},"order.id":"flat","a*b":"star","n":42.0}`
	for _, path := range [][]string{{"order", "id"}, {"order.id"}, {"a*b"}, {"order", "x|y", "z"}, {"n"}} {
		want := middlewareKey(t, "billing", keyfunc.JSONField(path...), payload)
		args := []string{"key", "--namespace", "billing"}
		for _, name := range path {
			args = append(args, "--json-field", name)
		}
		r := runOn(t, nil, payload, args...)
		require.Equal(t, exitOK, r.code, "%v: %s", path, r.stderr)
		require.Equal(t, want+"\n", r.stdout, "%v", path)
	}

	// A dotted name is one name, as in JSONField: the error says how to
	// name nested fields.
	r := runOn(t, nil, `{"order":{"id":"o-7"}}`, "key", "--namespace", "billing", "--json-field", "order.id")
	require.Equal(t, exitError, r.code)
	requireOneLine(t, r.stderr)
	require.Contains(t, r.stderr, "--json-field order --json-field id")

	// The same names from IDEM_JSON_FIELD; the command line replaces them.
	t.Setenv("IDEM_JSON_FIELD", "order,id")
	r = runOn(t, nil, payload, "key", "--namespace", "billing")
	require.Equal(t, "billing:o-7\n", r.stdout, r.stderr)
	r = runOn(t, nil, payload, "key", "--namespace", "billing", "--json-field", "order.id")
	require.Equal(t, "billing:flat\n", r.stdout, r.stderr)
}

// middlewareKey is the key the middleware stores for a message with
// payload, in namespace ns, with extractor ex.
func middlewareKey(t *testing.T, ns string, ex keyfunc.Extractor, payload string) string {
	t.Helper()
	idem, err := idempotency.New(idempotency.Config{Store: newMemstore(), Namespace: ns, Key: ex})
	require.NoError(t, err)
	var key string
	_, err = idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		lease, _ := idempotency.LeaseFromContext(msg.Context())
		key = lease.Key
		return nil, nil
	})(message.NewMessage("m-1", []byte(payload)))
	require.NoError(t, err)
	require.NotEmpty(t, key)
	return key
}

// Without --namespace idem key has no stored key to print.
func TestKeyNeedsTheNamespace(t *testing.T) {
	cleanEnv(t)
	r := runOn(t, nil, `{"order_id":"o-1"}`, "key", "--json-field", "order_id")
	require.Equal(t, exitError, r.code)
	require.Empty(t, r.stdout)
	requireOneLine(t, r.stderr)
	require.Contains(t, r.stderr, "--namespace is required")

	t.Setenv("IDEM_NAMESPACE", "charge")
	r = runOn(t, nil, `{"order_id":"o-1"}`, "key", "--json-field", "order_id")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Equal(t, "charge:o-1\n", r.stdout)
}

// list refuses, through the store, a cursor that no page of its namespace
// printed. idem does not decode the cursor, which the contract makes
// opaque: one that is well formed and names no namespace's key is a
// cursor of every namespace at once, which the store takes.
func TestListCursor(t *testing.T) {
	cleanEnv(t)
	ctx := context.Background()
	mem := newMemstore()
	for _, k := range []string{"charge:a", "charge:b", "charge:c", "refund:a"} {
		res, err := mem.Acquire(ctx, backends.AcquireRequest{Key: k, Owner: "w", LeaseTTL: time.Hour, Retention: time.Hour})
		require.NoError(t, err)
		require.NoError(t, mem.Complete(ctx, res.Lease, nil))
	}
	r := runOn(t, mem, "", "list", "--namespace", "charge", "--limit", "2", "-o", "json")
	require.Equal(t, exitOK, r.code, r.stderr)
	var page struct{ Cursor string }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
	require.NotEmpty(t, page.Cursor)
	r = runOn(t, mem, "", "list", "--namespace", "charge", "--cursor", page.Cursor)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `"charge:c"`)
	r = runOn(t, mem, "", "list", "--cursor", page.Cursor)
	require.Equal(t, exitOK, r.code, "a cursor of a namespace pages every key too: %s", r.stderr)
	r = runOn(t, mem, "", "list", "--cursor", "abcd")
	require.Equal(t, exitOK, r.code, "a well-formed cursor of every namespace: %s", r.stderr)

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--cursor", "notacursor"}, `--cursor "notacursor" is not a cursor idem list printed`},
		{[]string{"--cursor", "notacursor", "--namespace", "charge"}, `--cursor "notacursor" is not a cursor idem list printed`},
		{[]string{"--cursor", "not a cursor"}, `--cursor "not a cursor" is not a cursor idem list printed`},
		{[]string{"--cursor", "abcd", "--namespace", "charge"}, `--cursor "abcd" is not a cursor idem list printed for namespace "charge"`},
		{[]string{"--cursor", page.Cursor, "--namespace", "refund"}, `--cursor "` + page.Cursor + `" is not a cursor idem list printed for namespace "refund"`},
	} {
		r := runOn(t, mem, "", append([]string{"list"}, c.args...)...)
		require.Equal(t, exitError, r.code, "%v: %s", c.args, r.stdout)
		require.Empty(t, r.stdout)
		requireOneLine(t, r.stderr)
		require.Contains(t, r.stderr, c.want)
	}
}

// Every flag of every command has its IDEM_* variable, named after the
// flag, which sets it, and the operations guide lists both.
func TestEveryFlagHasItsVariable(t *testing.T) {
	cleanEnv(t)
	guide := idemGuide(t)
	for _, cmd := range commands {
		fs, _, _, err := newFlagSet(cmd, io.Discard)
		require.NoError(t, err)
		fs.VisitAll(func(f *flag.Flag) {
			name := envVar(f.Name)
			t.Run(cmd.name+"/"+f.Name, func(t *testing.T) {
				require.Contains(t, f.Usage, "("+name+")", "-h names the variable")
				spelling := "--" + f.Name
				if len(f.Name) == 1 {
					spelling = "-" + f.Name
				}
				require.True(t, strings.Contains(guide, "`"+spelling), "docs/operations.md lists the flag %s", spelling)
				require.True(t, strings.Contains(guide, "`"+name+"`"), "docs/operations.md lists its variable %s", name)

				value, want := sampleValue(f)
				t.Setenv(name, value)
				fs, _, _, err := newFlagSet(cmd, io.Discard)
				require.NoError(t, err)
				require.NoError(t, fs.Parse(nil))
				require.Equal(t, want, fs.Lookup(f.Name).Value.String(), "%s=%s sets %s", name, value, spelling)
			})
		})
	}
}

// sampleValue is a value for f's variable other than its default, and
// the value the flag then has.
func sampleValue(f *flag.Flag) (value, want string) {
	switch v := f.Value.(type) {
	case *stringsFlag:
		return "first,second", "first,second"
	case *metadataFlag:
		return "b=2,a=1", "a=1,b=2"
	case flag.Getter:
		switch v.Get().(type) {
		case bool:
			return "true", "true"
		case int:
			return "7", "7"
		case time.Duration:
			return "90s", "1m30s"
		}
	}
	return "from-the-variable", "from-the-variable"
}

// idemGuide returns the idem section of docs/operations.md.
func idemGuide(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	require.NoError(t, err, "the tests run in a clone of the repository")
	doc := string(b)
	start := strings.Index(doc, "## The `idem` command")
	require.GreaterOrEqual(t, start, 0)
	end := strings.Index(doc[start+1:], "\n## ")
	require.Greater(t, end, 0)
	return doc[start : start+1+end]
}

// The command line wins over the variables; a variable that does not
// parse is a usage error that names it.
func TestVariables(t *testing.T) {
	cleanEnv(t)
	mem := newMemstore()
	t.Setenv("IDEM_LIMIT", "5000")
	r := runOn(t, mem, "", "list")
	require.Equal(t, exitError, r.code)
	require.Contains(t, r.stderr, "list limit out of range (1 to 1000): 5000")
	r = runOn(t, mem, "", "list", "--limit", "2")
	require.Equal(t, exitOK, r.code, r.stderr)

	t.Setenv("IDEM_LIMIT", "ten")
	r = runOn(t, mem, "", "list")
	require.Equal(t, exitError, r.code)
	requireOneLine(t, r.stderr)
	require.Contains(t, r.stderr, "IDEM_LIMIT: parse error")

	t.Setenv("IDEM_LIMIT", "")
	t.Setenv("IDEM_SET", "order_id=o-1,region=eu")
	r = runOn(t, nil, "", "key", "--metadata", "region", "--namespace", "h")
	require.Equal(t, "h:eu\n", r.stdout, r.stderr)
	r = runOn(t, nil, "", "key", "--metadata", "region", "--namespace", "h", "--set", "order_id=o-2")
	require.Equal(t, exitError, r.code, "--set replaces IDEM_SET: %s", r.stdout)
}

// failingStore is a real store whose Count fails with err.
type failingStore struct {
	operatorStore
	err error
}

func (s failingStore) Count(context.Context, string) (backends.Counts, error) {
	return backends.Counts{}, s.err
}

// An error of several lines, as pgx words one for each address it tried,
// is still one line on stderr.
func TestFailureIsOneLine(t *testing.T) {
	cleanEnv(t)
	store := failingStore{newMemstore(), errors.New("failed to connect:\n\t127.0.0.1: refused\n\t::1: refused")}
	r := runOn(t, store, "", "stats")
	require.Equal(t, exitError, r.code)
	require.Equal(t, "idem: the test's store: failed to connect: 127.0.0.1: refused; ::1: refused\n", r.stderr)
}

// newMemstore is memstore.New with the zero options, which it never
// refuses.
func newMemstore() *memstore.Store {
	s, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	return s
}

// actions lists every action, for the tests that check each is reported
// and documented.
var actions = []string{actionReleased, actionCompleted, actionAlreadyCompleted, actionDeleted,
	actionNotFound, actionInProgress, actionNoLease, actionChanged}
