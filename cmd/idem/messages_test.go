package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Every failure is one line on stderr, idem's: a command line idem cannot
// run says what is wrong with it and how to list what it takes, never the
// flag package's usage text.
func TestEveryFailureIsOneLine(t *testing.T) {
	cleanEnv(t)
	mem := newMemstore()
	completed(t, mem, "charge:a")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{nil, exitError, "want a command: inspect, release, complete, delete, list, stats, key, pg, mysql, dynamodb or version (idem -h says what each does)"},
		{[]string{"frobnicate"}, exitError, `unknown command "frobnicate": want inspect, release,`},
		{[]string{"statz"}, exitError, `unknown command "statz" (did you mean stats?)`},
		{[]string{"--redis-url=redis://u:pw@h", "stats"}, exitError, "the command comes first, then its flags: idem COMMAND [flags]"},
		{[]string{"stats", "--json"}, exitError, "idem stats has no flag --json (-o json): run idem stats -h for its flags"},
		{[]string{"stats", "--namespce", "charge"}, exitError, "idem stats has no flag --namespce (did you mean --namespace?): run idem stats -h for its flags"},
		{[]string{"list", "--batch", "3"}, exitError, "idem list has no flag --batch (idem pg and idem mysql take it): run idem list -h for its flags"},
		{[]string{"stats", "--limit", "3"}, exitError, "idem stats has no flag --limit (idem list takes it)"},
		{[]string{"stats", "---namespace=x"}, exitError, "bad flag syntax: ---namespace: run idem stats -h for its flags"},
		{[]string{"list", "--limit", "ten"}, exitError, `invalid value "ten" for flag --limit: parse error: run idem list -h for its flags`},
		{[]string{"stats", "-o"}, exitError, "flag needs an argument: -o: run idem stats -h for its flags"},
		{[]string{"inspect", "charge:a", "-o"}, exitError, "flag needs an argument: -o: run idem inspect -h for its flags"},
		{[]string{"stats", "-o", "yaml"}, exitError, `-o must be table or json, got "yaml"`},
		{[]string{"inspect"}, exitError, "want at least one KEY: run idem inspect -h for its arguments and flags"},
		{[]string{"release", "charge:a", "charge:b"}, exitError, "want one KEY, got 2 arguments: run idem release -h for its arguments and flags"},
		{[]string{"version", "extra"}, exitError, "want no arguments, got 1 argument: run idem version -h"},
		{[]string{"pg", "frob"}, exitError, `unknown pg command "frob": migrate, schema or cleanup`},
		{[]string{"inspect", "charge:nope"}, exitNotFound, `"charge:nope" has no record`},
		{[]string{"release", "charge:a"}, exitRefused, `"charge:a" is completed: there is no lease to release`},
	} {
		r := runOn(t, mem, "", c.args...)
		require.Equal(t, c.code, r.code, "idem %q: %s%s", c.args, r.stdout, r.stderr)
		require.Empty(t, r.stdout, "idem %q", c.args)
		requireOneLine(t, r.stderr)
		require.Contains(t, r.stderr, c.want, "idem %q", c.args)
		require.NotContains(t, r.stderr, "pw@", "idem %q", c.args)
	}

	// inspect of several keys: a line for each key not found (each a
	// failure of its own), the records found on stdout.
	r := runOn(t, mem, "", "inspect", "charge:x", "charge:a", "charge:y")
	require.Equal(t, exitNotFound, r.code)
	require.Equal(t, "idem: \"charge:x\" has no record (never seen, or forgotten after its retention)\n"+
		"idem: \"charge:y\" has no record (never seen, or forgotten after its retention)\n", r.stderr)
	require.Contains(t, r.stdout, `"charge:a"`)

	// Help is not a failure: the usage, exit 0.
	for _, args := range [][]string{{"-h"}, {"help"}, {"stats", "-h"}, {"list", "--help"}} {
		r := runOn(t, mem, "", args...)
		require.Equal(t, exitOK, r.code, "idem %q", args)
		require.Contains(t, r.stderr, "usage: idem ", "idem %q", args)
	}
}

// completed records key as completed in store.
func completed(t *testing.T, store backends.Store, key string) {
	t.Helper()
	ctx := context.Background()
	res, err := store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: "w", LeaseTTL: time.Hour, Retention: time.Hour})
	require.NoError(t, err)
	require.NoError(t, store.Complete(ctx, res.Lease, nil))
}

// stats and list of a namespace with no records say why, on stderr, when
// one look at the store can tell: a typo, a namespace written with its
// colon, the namespaces that have records, or a store with none at all.
// The answer on stdout stays what it was, exit 0.
func TestEmptyNamespaceSaysWhy(t *testing.T) {
	cleanEnv(t)
	mem := newMemstore()
	r := runOn(t, mem, "", "stats")
	require.Equal(t, exitOK, r.code)
	require.Equal(t, "idem: the test's store has no records under the key prefix \"idempotency:\" (--redis-prefix)\n", r.stderr)
	r = runOn(t, mem, "", "stats", "--namespace", "billing")
	require.Equal(t, "idem: namespace \"billing\" has no records, nor has any other: the test's store has none under the key prefix \"idempotency:\" (--redis-prefix)\n", r.stderr)

	for _, k := range []string{"billing:a", "billing:b", "refund:a"} {
		completed(t, mem, k)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"stats", "--namespace", "billin"}, `namespace "billin" has no records (did you mean --namespace billing?); the namespaces with records: "billing", "refund" (idem list shows their keys)`},
		{[]string{"stats", "--namespace", "billing:", "-o", "json"}, `namespace "billing:" has no records: --namespace takes the namespace without the colon that ends it, --namespace billing; the namespaces with records: "billing", "refund"`},
		{[]string{"stats", "--namespace", "shipping"}, `namespace "shipping" has no records; the namespaces with records: "billing", "refund"`},
		{[]string{"list", "--namespace", "refnud"}, `namespace "refnud" has no records (did you mean --namespace refund?)`},
		{[]string{"list", "--namespace", "refnud", "-o", "json"}, `namespace "refnud" has no records (did you mean --namespace refund?)`},
	} {
		r := runOn(t, mem, "", c.args...)
		require.Equal(t, exitOK, r.code, "idem %q: %s", c.args, r.stderr)
		if c.args[0] == "stats" {
			require.Contains(t, r.stdout, "0", "the counts are printed")
		}
		if strings.Contains(strings.Join(c.args, " "), "json") {
			require.True(t, json.Valid([]byte(r.stdout)), "stdout stays JSON: %q", r.stdout)
		}
		requireOneLine(t, r.stderr)
		require.Contains(t, r.stderr, c.want, "idem %q", c.args)
	}
	// A namespace with records, none of them in the state asked for, or
	// a page after the first: nothing to explain.
	for _, args := range [][]string{
		{"stats", "--namespace", "billing"}, {"list", "--namespace", "billing", "--state", "in_progress"}, {"list", "--state", "released"},
	} {
		r := runOn(t, mem, "", args...)
		require.Equal(t, exitOK, r.code)
		require.Empty(t, r.stderr, "idem %q", args)
	}

	// More records than one look reads: it names the namespaces of the
	// first page, and says so.
	for i := range 2 * hintLimit {
		completed(t, mem, fmt.Sprintf("n%02d:k%03d", i%40, i))
	}
	r = runOn(t, mem, "", "stats", "--namespace", "nope")
	requireOneLine(t, r.stderr)
	require.Contains(t, r.stderr, fmt.Sprintf(`the namespaces of the first %d records: "billing", "n00", "n01", "n02", "n03" and 16 more (idem list shows their keys)`, hintLimit))
}
