package examples

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Every example program can be copied out of the repository: it imports
// the published modules and their dependencies, never a package under an
// internal/ directory of this repository (the test harness of
// examples/internal, for one: a copy could not import it), and it links
// no testing package. A published package may use its own module's
// internal packages (contrib/sqloutbox does): a copy builds with them.
func TestExamplesAreCopyable(t *testing.T) {
	mains, err := filepath.Glob("*/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(mains) < 4 {
		t.Fatalf("found %d example programs (%v); quickstart, redis, sqs and kafka at least", len(mains), mains)
	}
	for _, m := range mains {
		pkg := "./" + filepath.Dir(m)
		t.Run(filepath.Dir(m), func(t *testing.T) {
			imports, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, pkg).Output()
			if err != nil {
				t.Fatalf("go list %s: %v", pkg, err)
			}
			deps, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg).Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", pkg, err)
			}
			if bad := notCopyable(strings.Fields(string(imports)), strings.Fields(string(deps))); len(bad) > 0 {
				t.Errorf("%s depends on %v: a copy of it outside the repository would not build, or would link the testing package", pkg, bad)
			}
		})
	}
}

// notCopyable returns what an example must not use: an internal package
// of this repository among its imports, the testing package among its
// dependencies.
func notCopyable(imports, deps []string) []string {
	const repo = "github.com/watermill-idempotency/idempotency"
	var bad []string
	for _, d := range imports {
		if strings.HasPrefix(d, repo+"/") && (strings.Contains(d, "/internal/") || strings.HasSuffix(d, "/internal")) {
			bad = append(bad, d)
		}
	}
	for _, d := range deps {
		if d == "testing" {
			bad = append(bad, d)
		}
	}
	return bad
}

func TestNotCopyable(t *testing.T) {
	got := notCopyable([]string{
		"fmt",
		"github.com/watermill-idempotency/idempotency/middleware",
		"github.com/watermill-idempotency/idempotency/examples/internal/story",
		"github.com/watermill-idempotency/idempotency/internal",
		"go.opentelemetry.io/otel/internal/global",
	}, []string{
		"fmt",
		"testing",
		"github.com/watermill-idempotency/idempotency/contrib/sqloutbox/internal/outbox",
	})
	want := "[github.com/watermill-idempotency/idempotency/examples/internal/story github.com/watermill-idempotency/idempotency/internal testing]"
	if s := strings.Join(got, " "); "["+s+"]" != want {
		t.Errorf("notCopyable = [%s], want %s", s, want)
	}
}
