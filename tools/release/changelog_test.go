package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

const changelogHead = "# Changelog\n\nThe format follows Keep a Changelog.\n\n"

// testChangelog is a CHANGELOG.md whose [Unreleased] section holds
// unreleased, after which comes release 0.1.0 (or released, if given).
func testChangelog(unreleased string, released ...string) string {
	rel := "0.1.0"
	if len(released) > 0 {
		rel = released[0]
	}
	return changelogHead + "## [Unreleased]\n\n" + unreleased + "## [" + rel + "] - 2026-11-25\n\n### Added\n\n- The first version.\n"
}

func TestChangelogNext(t *testing.T) {
	for _, tc := range []struct {
		name, changelog, want string
	}{
		{"nothing unreleased: the newest release", testChangelog(""), "v0.1.0"},
		{"prose but no entry", testChangelog("Work in progress.\n\n### Added\n\n"), "v0.1.0"},
		{"fixes before 1.0", testChangelog("### Fixed\n\n- A fix.\n\n"), "v0.1.1"},
		{"security fixes before 1.0", testChangelog("### Security\n\n- A fix.\n\n"), "v0.1.1"},
		{"additions before 1.0", testChangelog("### Added\n\n- A feature.\n\n### Fixed\n\n- A fix.\n\n"), "v0.2.0"},
		{"changes before 1.0", testChangelog("Prose.\n\n### Changed\n\n- Renamed.\n\n"), "v0.2.0"},
		{"removals before 1.0", testChangelog("### Removed\n\n* Gone.\n\n"), "v0.2.0"},
		{"a heading without entries counts for nothing", testChangelog("### Changed\n\n### Fixed\n\n- A fix.\n\n"), "v0.1.1"},
		{"fixes from 1.0", testChangelog("### Fixed\n\n- A fix.\n\n", "1.2.3"), "v1.2.4"},
		{"additions from 1.0", testChangelog("### Added\n\n- A feature.\n\n### Deprecated\n\n- Old.\n\n", "1.2.3"), "v1.3.0"},
		{"changes from 1.0", testChangelog("### Changed\n\n- Renamed.\n\n", "1.2.3"), "v2.0.0"},
		{"another heading counts as changed", testChangelog("### Reworked\n\n- Everything.\n\n", "1.2.3"), "v2.0.0"},
		{"no release yet", changelogHead + "## [Unreleased]\n\n### Added\n\n- All.\n", "v0.1.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, err := parseChangelog([]byte(tc.changelog))
			if err != nil {
				t.Fatal(err)
			}
			got, why := cl.next()
			if got != tc.want {
				t.Errorf("next = %s (%s), want %s", got, why, tc.want)
			}
			if v, _, err := chooseVersion(cl, ""); err != nil || v != tc.want {
				t.Errorf("chooseVersion = %s, %v; want %s", v, err, tc.want)
			}
		})
	}
	for _, bad := range []string{
		changelogHead + "## 0.1.0\n",
		changelogHead + "## [Unreleased]\n\n## 0.1.0 (2026-11-25)\n",
	} {
		if _, err := parseChangelog([]byte(bad)); err == nil {
			t.Errorf("parseChangelog(%q): want an error", bad)
		}
	}
}

// A release's version is at least the one semver gives for what
// [Unreleased] holds, and after the newest release; with nothing
// unreleased only the newest release itself is (its section moved by
// hand).
func TestChangelogCheckRelease(t *testing.T) {
	changed, err := parseChangelog([]byte(testChangelog("### Changed\n\n- Renamed.\n\n")))
	if err != nil {
		t.Fatal(err)
	}
	empty, err := parseChangelog([]byte(testChangelog("")))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cl      *changelog
		v, want string // want: "" for accepted, else in the error
	}{
		{changed, "v0.2.0", ""},
		{changed, "v1.0.0", ""},
		{changed, "v0.2.0-rc.1", "is below v0.2.0"},
		{changed, "v0.1.1", "is below v0.2.0, the version semver gives: after v0.1.0 (CHANGELOG.md, 2026-11-25), [Unreleased] has Changed entries"},
		{changed, "v0.1.0", "is not after v0.1.0"},
		{empty, "v0.1.0", ""},
		{empty, "v0.2.0", "no entry under [Unreleased]"},
	} {
		err := tc.cl.checkRelease(tc.v)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("checkRelease(%s) = %v; want %q", tc.v, err, tc.want)
		}
		if _, _, err := chooseVersion(tc.cl, tc.v); (err == nil) != (tc.want == "") {
			t.Errorf("chooseVersion(%s) = %v", tc.v, err)
		}
	}
}

// The release moves [Unreleased]'s prose and entries under the version's
// heading, and leaves [Unreleased] empty above it.
func TestChangelogRelease(t *testing.T) {
	cl, err := parseChangelog([]byte(testChangelog("The 1.0 shape.\n\n### Changed\n\n- Renamed.\n\n### Fixed\n\n- A fix.\n\n")))
	if err != nil {
		t.Fatal(err)
	}
	got, err := cl.release("v0.2.0", "2026-12-24")
	if err != nil {
		t.Fatal(err)
	}
	want := changelogHead + "## [Unreleased]\n\n## [0.2.0] - 2026-12-24\n\nThe 1.0 shape.\n\n### Changed\n\n- Renamed.\n\n### Fixed\n\n- A fix.\n\n" +
		"## [0.1.0] - 2026-11-25\n\n### Added\n\n- The first version.\n"
	if string(got) != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	// Released, it names the version, and releases nothing more.
	after, err := parseChangelog(got)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := after.next(); v != "v0.2.0" || after.date != "2026-12-24" {
		t.Fatalf("after the release: next %s, date %s", v, after.date)
	}
	if again, err := after.release("v0.2.0", "2026-12-25"); err != nil || string(again) != string(got) {
		t.Fatalf("releasing again: %v\n%s", err, again)
	}
	if _, err := cl.release("v0.1.1", "2026-12-24"); err == nil {
		t.Fatal("a patch release of a Changed entry: want an error")
	}
}

func TestSetInstallVersions(t *testing.T) {
	doc := "```sh\ngo get " + root + "@v0.1.0\ngo get " + root + "/backends/mysqlstore@v0.1.0   # MySQL\n" +
		"go install " + root + "/cmd/idem@v0.1.0-rc.2\n```\n" +
		"Not ours: " + root + "-extra@v0.1.0, github.com/other/mod@v0.1.0; no version: " + root + "/cmd/idem@latest.\n"
	want := "```sh\ngo get " + root + "@v0.2.0\ngo get " + root + "/backends/mysqlstore@v0.2.0   # MySQL\n" +
		"go install " + root + "/cmd/idem@v0.2.0\n```\n" +
		"Not ours: " + root + "-extra@v0.1.0, github.com/other/mod@v0.1.0; no version: " + root + "/cmd/idem@latest.\n"
	got := setInstallVersions([]byte(doc), root, "v0.2.0")
	if string(got) != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if lines := installLines([]byte(doc), root, "v0.1.0"); !slices.Equal(lines, []string{"line 4: " + root + "/cmd/idem@v0.1.0-rc.2"}) {
		t.Fatalf("installLines: %q", lines)
	}
	if lines := installLines(got, root, "v0.2.0"); len(lines) != 0 {
		t.Fatalf("installLines after: %q", lines)
	}
}

// prepareDocs writes the release's CHANGELOG.md and every document's
// install lines into the copy, and lists what it changed for writeBack.
func TestPrepareDocs(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"CHANGELOG.md":      testChangelog("### Changed\n\n- Renamed " + root + "@v0.1.0's API.\n\n"),
		"README.md":         "go get " + root + "@v0.1.0\n",
		"docs/mysql.md":     "go get " + root + "/backends/mysqlstore@v0.1.0\n",
		"docs/concepts.md":  "no install line\n",
		"examples/notes.md": "go install " + root + "/cmd/idem@v0.1.0\n",
		"cmd/idem/main.go":  "// go install " + root + "/cmd/idem@v0.1.0\n",
	}
	for name, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := parseChangelog([]byte(files["CHANGELOG.md"]))
	if err != nil {
		t.Fatal(err)
	}
	r := &release{o: options{date: "2026-12-24"}, src: dir, cl: cl, version: "v0.2.0", ws: testWorkspace(t, threeWork, threeMods("v0.1.0"))}
	if err := r.prepareDocs(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(r.docs)
	if want := []string{"CHANGELOG.md", "README.md", "docs/mysql.md", "examples/notes.md"}; !slices.Equal(r.docs, want) {
		t.Fatalf("changed %q, want %q", r.docs, want)
	}
	read := func(name string) string {
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	if got := read("README.md"); got != "go get "+root+"@v0.2.0\n" {
		t.Errorf("README.md: %q", got)
	}
	if got := read("cmd/idem/main.go"); got != files["cmd/idem/main.go"] {
		t.Errorf("a Go file changed: %q", got)
	}
	if got := read("CHANGELOG.md"); !strings.Contains(got, "## [Unreleased]\n\n## [0.2.0] - 2026-12-24\n\n### Changed\n\n- Renamed "+root+"@v0.1.0's API.\n") {
		t.Errorf("CHANGELOG.md, its entries kept as written:\n%s", got)
	}
}

// The repository as committed: every install line of its documents, every
// sibling require and go.work's replace lines name the newest release
// CHANGELOG.md lists. make release moves all of them at once.
func TestRepositoryFollowsTheChangelog(t *testing.T) {
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("the test runs in a clone of the repository: %v", err)
	}
	repo := strings.TrimSpace(string(top))
	read := func(name string) []byte {
		data, err := os.ReadFile(filepath.Join(repo, filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	cl, err := parseChangelog(read("CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	if cl.released == "" {
		t.Fatal("CHANGELOG.md lists no release")
	}
	ws, err := parseWorkspace(read("go.work"), func(dir string) ([]byte, error) { return read(dir + "/go.mod"), nil })
	if err != nil {
		t.Fatal(err)
	}
	rootPath := ws.rootPath()

	docs, err := exec.Command("git", "-C", repo, "ls-files", "*.md").Output()
	if err != nil {
		t.Fatal(err)
	}
	readmeLines := 0
	for _, name := range strings.Fields(string(docs)) {
		if !isInstallDoc(name) {
			continue
		}
		data := read(name)
		for _, l := range installLines(data, rootPath, cl.released) {
			t.Errorf("%s:%s: CHANGELOG.md's newest release is %s", name, strings.TrimPrefix(l, "line "), cl.released)
		}
		if name == "README.md" {
			readmeLines = len(installVersion(rootPath).FindAll(data, -1))
		}
	}
	if readmeLines < 2 {
		t.Errorf("README.md has %d install lines of the modules; this test reads them as %s", readmeLines, installVersion(rootPath))
	}

	if v, err := requiredVersion(ws); err != nil || v != cl.released {
		t.Errorf("the siblings are required at %s (%v); CHANGELOG.md's newest release is %s", v, err, cl.released)
	}
	wf, err := modfile.ParseWork("go.work", read("go.work"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range wf.Replace {
		if ws.isSibling(r.Old.Path) && r.Old.Version != cl.released {
			t.Errorf("go.work replaces %s %s; CHANGELOG.md's newest release is %s", r.Old.Path, r.Old.Version, cl.released)
		}
	}
}
