package examples

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Every example program can be copied out of the repository: what it
// builds from is the published modules and their dependencies, never a
// package under an internal/ directory of this repository (the test
// harness of examples/internal, for one), and never the testing package.
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
			out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg).Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", pkg, err)
			}
			if bad := notCopyable(strings.Fields(string(out))); len(bad) > 0 {
				t.Errorf("%s depends on %v: a copy of it outside the repository would not build, or would link the testing package", pkg, bad)
			}
		})
	}
}

// notCopyable returns the packages of deps that an example must not use.
func notCopyable(deps []string) []string {
	const repo = "github.com/watermill-idempotency/idempotency"
	var bad []string
	for _, d := range deps {
		internal := strings.HasPrefix(d, repo+"/") && (strings.Contains(d, "/internal/") || strings.HasSuffix(d, "/internal"))
		if internal || d == "testing" {
			bad = append(bad, d)
		}
	}
	return bad
}

func TestNotCopyable(t *testing.T) {
	got := notCopyable([]string{
		"fmt",
		"testing",
		"github.com/watermill-idempotency/idempotency/middleware",
		"github.com/watermill-idempotency/idempotency/examples/internal/story",
		"github.com/watermill-idempotency/idempotency/internal",
		"go.opentelemetry.io/otel/internal/global",
	})
	want := "[testing github.com/watermill-idempotency/idempotency/examples/internal/story github.com/watermill-idempotency/idempotency/internal]"
	if s := strings.Join(got, " "); "["+s+"]" != want {
		t.Errorf("notCopyable = [%s], want %s", s, want)
	}
}
