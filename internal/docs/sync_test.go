// Package docs keeps the code in README.md and docs/ true: every Go and SQL
// block there is a copy of a region of a file in this folder, which CI
// compiles (and, for the SQL, runs against Postgres). A block in the docs
// names its source on the line before it:
//
//	<!-- snippet: internal/docs/operations_test.go#inspect -->
//
// and the source marks the region with "// snippet:quickstart" (or
// "-- snippet:..." in SQL, or "{{/* snippet:... */ -}}" in a SQL template)
// and "// end snippet" lines. A region may come in
// several parts (an import block, then a function body); the parts are
// joined with a blank line. TestSnippetsMatchSources fails when a block
// differs from its source or names none;
//
//	go test ./internal/docs -run Snippets -update
//
// rewrites the blocks from their sources.
package docs

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the docs' code blocks from their sources")

// root is the repository root, this package's folder being internal/docs.
var root = func() string {
	abs, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		panic(err)
	}
	return abs
}()

var (
	markerRE = regexp.MustCompile(`^<!-- snippet: ([^#\s]+)#(\S+) -->$`)
	fenceRE  = regexp.MustCompile("^( *)```(go|sql)$")
)

// docFiles lists the Markdown files whose code blocks must come from
// sources.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range more {
		rel, _ := filepath.Rel(root, f)
		files = append(files, rel)
	}
	return files
}

// region returns the named region of file (a path from the repository
// root): its parts, each dedented, joined by a blank line.
func region(file, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		return "", err
	}
	var parts [][]string
	var cur []string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "// snippet:"+name || trimmed == "-- snippet:"+name || templateMark(trimmed) == "snippet:"+name:
			if in {
				return "", fmt.Errorf("%s: region %q opened twice", file, name)
			}
			in, cur = true, nil
		case in && (trimmed == "// end snippet" || trimmed == "-- end snippet" || templateMark(trimmed) == "end snippet"):
			in = false
			parts = append(parts, trimBlank(dedent(cur)))
		case in:
			cur = append(cur, line)
		}
	}
	if in {
		return "", fmt.Errorf("%s: region %q is not closed", file, name)
	}
	if len(parts) == 0 {
		return "", fmt.Errorf("%s: no region %q", file, name)
	}
	joined := make([]string, len(parts))
	for i, p := range parts {
		joined[i] = strings.Join(p, "\n")
	}
	return strings.Join(joined, "\n\n"), nil
}

// templateMarkRE matches a region mark in a file that is a Go template
// (the stores' schema.sql): a template comment, which leaves no trace in
// the SQL the template renders.
var templateMarkRE = regexp.MustCompile(`^\{\{-? ?/\* (.+) \*/ ?-?\}\}$`)

// templateMark returns the text of a template comment line, or "".
func templateMark(line string) string {
	if m := templateMarkRE.FindStringSubmatch(line); m != nil {
		return m[1]
	}
	return ""
}

// unindent joins a block's lines, less the indentation of its fence (a
// block inside a list item).
func unindent(lines []string, indent string) string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = strings.TrimPrefix(l, indent)
	}
	return strings.Join(out, "\n")
}

// reindent indents every non-empty line of text by indent.
func reindent(text, indent string) string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = indent + l
		}
	}
	return strings.Join(lines, "\n")
}

// trimBlank drops blank lines at both ends.
func trimBlank(lines []string) []string {
	for len(lines) > 0 && lines[0] == "" {
		lines = lines[1:]
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// dedent removes the indentation common to every non-blank line.
func dedent(lines []string) []string {
	common := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		n := len(l) - len(strings.TrimLeft(l, "\t"))
		if common < 0 || n < common {
			common = n
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		if len(l) >= common && common > 0 {
			l = l[common:]
		}
		out[i] = strings.TrimRight(l, " \t")
	}
	return out
}

func TestSnippetsMatchSources(t *testing.T) {
	for _, file := range docFiles(t) {
		path := filepath.Join(root, file)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		var out []string
		changed := false
		for i := 0; i < len(lines); i++ {
			out = append(out, lines[i])
			m := fenceRE.FindStringSubmatch(lines[i])
			if m == nil {
				continue
			}
			indent := m[1]
			end := i + 1
			for end < len(lines) && lines[end] != indent+"```" {
				end++
			}
			if end == len(lines) {
				t.Errorf("%s:%d: code block not closed", file, i+1)
				break
			}
			body := unindent(lines[i+1:end], indent)
			prev := ""
			if i > 0 {
				prev = strings.TrimSpace(lines[i-1])
			}
			mk := markerRE.FindStringSubmatch(prev)
			if mk == nil {
				t.Errorf("%s:%d: a %s block without a source: put <!-- snippet: FILE#REGION --> on the line before it", file, i+1, m[2])
				out = append(out, lines[i+1:end+1]...)
				i = end
				continue
			}
			want, err := region(mk[1], mk[2])
			if err != nil {
				t.Errorf("%s:%d: %v", file, i+1, err)
				want = body
			}
			if body != want {
				if *update {
					changed = true
				} else {
					t.Errorf("%s:%d: the block differs from %s#%s (go test ./internal/docs -run Snippets -update rewrites it):\n--- doc\n%s\n--- source\n%s",
						file, i+1, mk[1], mk[2], body, want)
					want = body
				}
			}
			out = append(out, reindent(want, indent), indent+"```")
			i = end
		}
		if changed {
			if err := os.WriteFile(path, []byte(strings.Join(out, "\n")), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: rewritten from its sources", file)
		}
	}
}

// The extractor itself: parts joined, indentation removed, errors named.
func TestRegion(t *testing.T) {
	dir := t.TempDir()
	rel, err := filepath.Rel(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	src := "package x\n\nimport (\n\t// snippet:a\n\t\"fmt\"\n\t// end snippet\n)\n\nfunc f() {\n\t// snippet:a\n\tfmt.Println(1)\n\tif true {\n\t\tfmt.Println(2)\n\t}\n\t// end snippet\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := region(filepath.Join(rel, "x.go"), "a")
	if err != nil {
		t.Fatal(err)
	}
	want := "\"fmt\"\n\nfmt.Println(1)\nif true {\n\tfmt.Println(2)\n}"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := region(filepath.Join(rel, "x.go"), "missing"); err == nil {
		t.Fatal("a missing region is an error")
	}
}
