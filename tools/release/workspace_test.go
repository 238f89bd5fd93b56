package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

const root = "github.com/watermill-idempotency/idempotency"

// testWorkspace builds a workspace from go.work text and go.mod texts by
// directory.
func testWorkspace(t *testing.T, work string, mods map[string]string) *workspace {
	t.Helper()
	ws, err := parseWorkspace([]byte(work), func(dir string) ([]byte, error) {
		data, ok := mods[dir]
		if !ok {
			return nil, fmt.Errorf("no go.mod in %s", dir)
		}
		return []byte(data), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

const threeWork = `go 1.26.0

use (
	.
	./backends/mysqlstore
	./cmd/idem
)
`

// threeMods: cmd/idem requires mysqlstore and the root, mysqlstore the root.
func threeMods(v string) map[string]string {
	return map[string]string{
		".": "module " + root + "\n\ngo 1.26.0\n",
		"backends/mysqlstore": "module " + root + "/backends/mysqlstore\n\ngo 1.26.0\n\nrequire (\n\tgithub.com/go-sql-driver/mysql v1.10.1\n\t" +
			root + " " + v + "\n)\n",
		"cmd/idem": "module " + root + "/cmd/idem\n\ngo 1.26.0\n\nrequire (\n\t" + root + "/backends/mysqlstore " + v + "\n)\n\nrequire " + root + " " + v + " // indirect\n",
	}
}

// -tidy serves the tree at the version every sibling require carries.
func TestRequiredVersion(t *testing.T) {
	if v, err := requiredVersion(testWorkspace(t, threeWork, threeMods("v0.1.0"))); err != nil || v != "v0.1.0" {
		t.Fatalf("got %q, %v; want v0.1.0", v, err)
	}
	t.Run("siblings disagree", func(t *testing.T) {
		mods := threeMods("v0.1.0")
		mods["cmd/idem"] = strings.Replace(mods["cmd/idem"], "/backends/mysqlstore v0.1.0", "/backends/mysqlstore v0.3.0", 1)
		_, err := requiredVersion(testWorkspace(t, threeWork, mods))
		if err == nil || !strings.Contains(err.Error(), "v0.1.0") || !strings.Contains(err.Error(), "v0.3.0: cmd/idem/go.mod: "+root+"/backends/mysqlstore") {
			t.Fatalf("want an error naming both versions and where, got %v", err)
		}
	})
	t.Run("no sibling required", func(t *testing.T) {
		ws := testWorkspace(t, "go 1.26.0\nuse .\n", map[string]string{".": "module " + root + "\n"})
		if _, err := requiredVersion(ws); err == nil {
			t.Fatal("want an error")
		}
	})
}

func TestTagName(t *testing.T) {
	for _, tc := range [][3]string{
		{".", "v0.2.0", "v0.2.0"},
		{"backends/mysqlstore", "v0.2.0", "backends/mysqlstore/v0.2.0"},
		{"cmd/idem", "v1.0.0", "cmd/idem/v1.0.0"},
	} {
		if got := tagName(tc[0], tc[1]); got != tc[2] {
			t.Errorf("tagName(%q, %q) = %q, want %q", tc[0], tc[1], got, tc[2])
		}
	}
}

func TestProblems(t *testing.T) {
	if p := testWorkspace(t, threeWork, threeMods("v0.1.0")).problems(); len(p) > 0 {
		t.Fatalf("clean modules: %q", p)
	}
	for _, tc := range []struct {
		name string
		edit func(mods map[string]string)
		want []string
	}{
		{"replace", func(mods map[string]string) {
			mods["cmd/idem"] += "\nreplace " + root + " => ../..\n"
		}, []string{"cmd/idem/go.mod:11: replace " + root}},
		{"v0.0.0 and pseudo-version", func(mods map[string]string) {
			mods["backends/mysqlstore"] = strings.Replace(mods["backends/mysqlstore"], root+" v0.1.0", root+" v0.0.0", 1)
			mods["cmd/idem"] = strings.Replace(mods["cmd/idem"], "mysqlstore v0.1.0", "mysqlstore v0.0.0-20260101000000-abcdefabcdef", 1)
		}, []string{
			"backends/mysqlstore/go.mod:7: require " + root + " v0.0.0",
			"cmd/idem/go.mod:6: require " + root + "/backends/mysqlstore v0.0.0-20260101000000-abcdefabcdef",
		}},
		{"path a tag cannot serve", func(mods map[string]string) {
			mods["backends/mysqlstore"] = strings.Replace(mods["backends/mysqlstore"], "module "+root+"/backends/mysqlstore", "module example.com/mysqlstore", 1)
			mods["cmd/idem"] = strings.ReplaceAll(mods["cmd/idem"], root+"/backends/mysqlstore", "example.com/mysqlstore")
		}, []string{"backends/mysqlstore/go.mod: module example.com/mysqlstore"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mods := threeMods("v0.1.0")
			tc.edit(mods)
			p := testWorkspace(t, threeWork, mods).problems()
			if len(p) != len(tc.want) {
				t.Fatalf("got %q, want %d problems", p, len(tc.want))
			}
			for i := range p {
				if !strings.HasPrefix(p[i], tc.want[i]) {
					t.Errorf("problem %d: %q, want it to start with %q", i, p[i], tc.want[i])
				}
			}
		})
	}
}

func TestLayers(t *testing.T) {
	work := "go 1.26.0\n\nuse (\n\t./examples\n\t./cmd/idem\n\t.\n\t./backends/mysqlstore\n\t./contrib/idemotel\n)\n"
	mods := threeMods("v0.1.0")
	mods["contrib/idemotel"] = "module " + root + "/contrib/idemotel\n\nrequire " + root + " v0.1.0\n"
	mods["examples"] = "module " + root + "/examples\n\nrequire (\n\t" + root + "/cmd/idem v0.1.0\n\t" + root + "/contrib/idemotel v0.1.0 // indirect\n)\n"
	layers, err := testWorkspace(t, work, mods).layers()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range layers {
		var dirs []string
		for _, m := range l {
			dirs = append(dirs, m.Dir)
		}
		got = append(got, strings.Join(dirs, " "))
	}
	want := []string{".", "backends/mysqlstore contrib/idemotel", "cmd/idem", "examples"}
	if !slices.Equal(got, want) {
		t.Fatalf("layers %q, want %q", got, want)
	}

	mods["."] = "module " + root + "\n\nrequire " + root + "/examples v0.1.0\n"
	_, err = testWorkspace(t, work, mods).layers()
	if err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Fatalf("a cycle: got %v", err)
	}
}

func TestRewriteGoMod(t *testing.T) {
	in := `module ` + root + `/examples

go 1.26.0

require (
	github.com/ThreeDotsLabs/watermill v1.5.3
	` + root + ` v0.1.0
	` + root + `/backends/mysqlstore v0.1.0 // the MySQL store
)

require (
	github.com/google/uuid v1.6.0 // indirect
	` + root + `/contrib/idemotel v0.1.0 // indirect
)
`
	want := strings.ReplaceAll(in, " v0.1.0", " v0.2.0")
	isSibling := func(p string) bool { return strings.HasPrefix(p, root) }
	got, err := rewriteGoMod("go.mod", []byte(in), isSibling, "v0.2.0")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// Other modules keep their versions, even the same one.
	notSibling := func(p string) bool { return p == root }
	got, err = rewriteGoMod("go.mod", []byte(in), notSibling, "v0.2.0")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Replace(in, root+" v0.1.0", root+" v0.2.0", 1); string(got) != want {
		t.Errorf("only the root: got\n%s", got)
	}
	// Nothing to change: the very bytes back.
	odd := strings.Replace(in, "go 1.26.0", "go    1.26.0", 1)
	got, err = rewriteGoMod("go.mod", []byte(odd), isSibling, "v0.1.0")
	if err != nil || string(got) != odd {
		t.Errorf("unchanged: got %q, %v", got, err)
	}
}

func TestRewriteGoWork(t *testing.T) {
	in := `// The workspace.
go 1.26.0

use (
	.
	./backends/mysqlstore
	./cmd/idem
)

replace (
	` + root + ` v0.1.0 => ./
	` + root + `/backends/mysqlstore v0.1.0 => ./backends/mysqlstore
	github.com/other/mod v0.1.0 => ../other
)
`
	ws := testWorkspace(t, in, threeMods("v0.1.0"))
	got, err := rewriteGoWork([]byte(in), ws.Mods, "v0.2.0")
	if err != nil {
		t.Fatal(err)
	}
	want := `// The workspace.
go 1.26.0

use (
	.
	./backends/mysqlstore
	./cmd/idem
)

replace (
	` + root + ` v0.2.0 => ./
	` + root + `/backends/mysqlstore v0.2.0 => ./backends/mysqlstore
	github.com/other/mod v0.1.0 => ../other
	` + root + `/cmd/idem v0.2.0 => ./cmd/idem
)
`
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}

	single := "go 1.26.0\n\nuse .\n\nreplace " + root + " v0.1.0 => ./\n"
	ws = testWorkspace(t, single, map[string]string{".": "module " + root + "\n"})
	got, err = rewriteGoWork([]byte(single), ws.Mods, "v0.3.0")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Replace(single, "v0.1.0", "v0.3.0", 1); string(got) != want {
		t.Errorf("single line: got\n%s\nwant\n%s", got, want)
	}
	got, err = rewriteGoWork([]byte(single), ws.Mods, "v0.1.0")
	if err != nil || string(got) != single {
		t.Errorf("unchanged: got %q, %v", got, err)
	}

	bare := "go 1.26.0\n\nuse .\n"
	got, err = rewriteGoWork([]byte(bare), ws.Mods, "v0.3.0")
	if want := bare + "\nreplace " + root + " v0.3.0 => ./\n"; err != nil || string(got) != want {
		t.Errorf("no replace yet: got %q, %v; want %q", got, err, want)
	}
}

func TestForeignSumLines(t *testing.T) {
	sum := root + " v0.1.0 h1:aaa=\n" +
		root + " v0.1.0/go.mod h1:bbb=\n" +
		"github.com/google/uuid v1.6.0 h1:ccc=\n" +
		root + "/backends/mysqlstore v0.1.0/go.mod h1:ddd=\n" +
		root + "x v0.1.0/go.mod h1:eee=\n"
	isSibling := func(p string) bool { return p == root || p == root+"/backends/mysqlstore" }
	got := foreignSumLines([]byte(sum), isSibling)
	want := []string{"github.com/google/uuid v1.6.0 h1:ccc=", root + "x v0.1.0/go.mod h1:eee="}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestLineDiff(t *testing.T) {
	a := []string{"module m", "", "require (", "\ta v1", "\tb v1", "\tc v1", ")", "x", "y", "z"}
	b := []string{"module m", "", "require (", "\ta v1", "\tc v1", "\td v1", ")", "x", "y", "z"}
	want := "@@ line 3\n  require (\n  \ta v1\n- \tb v1\n  \tc v1\n+ \td v1\n  )\n  x\n"
	if got := lineDiff(a, b); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got := lineDiff(a, a); got != "" {
		t.Errorf("equal: got %q", got)
	}
	if got := lineDiff(nil, []string{"new"}); got != "@@ line 1\n+ new\n" {
		t.Errorf("from nothing: got %q", got)
	}
}
