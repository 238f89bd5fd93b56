package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// testLink is a link to a test by name: [`TestName`](path/to/file_test.go).
var testLink = regexp.MustCompile("\\[`(Test[A-Za-z0-9_]+)`\\]\\(([^)#]+_test\\.go)\\)")

// Every link to a test in the docs names a test that the linked file
// declares, so that a claim stays tied to the test that proves it when
// tests move or are renamed. docs/brokers.md links each row of its
// matrix so.
func TestLinkedTestsExist(t *testing.T) {
	found := 0
	for _, doc := range docFiles(t) {
		text, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range testLink.FindAllStringSubmatch(string(text), -1) {
			found++
			name, file := m[1], filepath.Join(root, filepath.Dir(doc), m[2])
			src, err := os.ReadFile(file)
			if err != nil {
				t.Errorf("%s links %s to %s: %v", doc, name, m[2], err)
				continue
			}
			if !strings.Contains(string(src), "func "+name+"(") {
				t.Errorf("%s links %s to %s, which does not declare it", doc, name, m[2])
			}
		}
	}
	if found < 9 {
		t.Errorf("%d links to tests in the docs; docs/brokers.md alone links one a broker", found)
	}
}
