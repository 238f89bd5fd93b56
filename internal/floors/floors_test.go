package floors

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// repo is the path every module of the repository starts with.
const repo = "github.com/watermill-idempotency/idempotency"

// floors names the floors below the top, lowest first, each by the
// package paths (relative to repo) that make it up with everything under
// them. A package on none of them is on the top floor.
var floors = []struct {
	name  string
	paths []string
}{
	{"stores", []string{"backends", "internal/stack"}},
	{"keys", []string{"keyfunc"}},
	{"middleware", []string{"middleware"}},
}

// floor returns the floor of package pkg, 0 for the lowest, and its name.
func floor(pkg string) (int, string) {
	rel := strings.TrimPrefix(pkg, repo+"/")
	for i, f := range floors {
		for _, p := range f.paths {
			if rel == p || strings.HasPrefix(rel, p+"/") {
				return i, f.name
			}
		}
	}
	return len(floors), "top"
}

// upward returns one line for every import, in graph (package → what its
// own code imports), of a repository package on a higher floor than the
// importer's.
func upward(graph map[string][]string) []string {
	var bad []string
	for pkg, imports := range graph {
		from, fromName := floor(pkg)
		for _, imp := range imports {
			if !strings.HasPrefix(imp, repo+"/") && imp != repo {
				continue
			}
			if to, toName := floor(imp); to > from {
				bad = append(bad, fmt.Sprintf("%s (floor %s) imports %s (floor %s)", pkg, fromName, imp, toName))
			}
		}
	}
	slices.Sort(bad)
	return bad
}

// No package's own code imports a package on a floor above its own, in
// any module of the workspace: not a store the middleware or the
// conformance suite, not the key functions a store. `make lint` runs this
// test too.
func TestNoImportUpward(t *testing.T) {
	// In the workspace the pattern matches the packages of every module
	// (go.work), and .Imports lists a package's imports without its tests'.
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, repo+"/...").Output()
	if err != nil {
		// An import back up that closes a cycle fails go list itself.
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list %s/...: %v\n%s", repo, err, stderr)
	}
	graph := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 {
			graph[f[0]] = f[1:]
		}
	}
	// A workspace left out (GOWORK=off) would list the core module alone.
	for _, want := range []string{"backends/memstore", "backends/mysqlstore", "backends/dynamostore", "keyfunc", "middleware", "storetest", "contrib/idemotel", "cmd/idem"} {
		if _, ok := graph[repo+"/"+want]; !ok {
			t.Fatalf("go list %s/... listed no package %s (%d packages): run in the workspace", repo, want, len(graph))
		}
	}
	for _, b := range upward(graph) {
		t.Error(b)
	}
}

// The check finds an arrow back up, and only those, wherever in the
// tree it is.
func TestUpwardFindsArrowsBackUp(t *testing.T) {
	graph := map[string][]string{
		repo + "/backends":                {"context"},
		repo + "/backends/memstore":       {repo + "/backends", repo + "/backends/storekit"},
		repo + "/backends/mysqlstore":     {repo + "/backends", repo + "/middleware"},
		repo + "/backends/dynamostore/x":  {repo + "/storetest"},
		repo + "/backends/redisstore":     {repo + "/keyfunc"},
		repo + "/keyfunc":                 {repo + "/backends", repo + "/contrib/idemotel"},
		repo + "/middleware":              {repo + "/backends", repo + "/keyfunc", repo + "/httpidem"},
		repo + "/storetest":               {repo + "/middleware", repo + "/httpidem", repo + "/backends"},
		repo + "/internal/testserver":     {"net"},
		repo + "/cmd/idem":                {repo + "/backends", repo + "/contrib/idemotel"},
		repo + "/examples/internal/story": {repo + "/storetest"},
	}
	want := []string{
		repo + "/backends/dynamostore/x (floor stores) imports " + repo + "/storetest (floor top)",
		repo + "/backends/mysqlstore (floor stores) imports " + repo + "/middleware (floor middleware)",
		repo + "/backends/redisstore (floor stores) imports " + repo + "/keyfunc (floor keys)",
		repo + "/keyfunc (floor keys) imports " + repo + "/contrib/idemotel (floor top)",
		repo + "/middleware (floor middleware) imports " + repo + "/httpidem (floor top)",
	}
	if got := upward(graph); !slices.Equal(got, want) {
		t.Errorf("upward found\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
