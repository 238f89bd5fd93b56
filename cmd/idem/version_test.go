package main

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

// idem version prints the module version go install stamped into the
// binary, and (devel) when there is none.
func TestVersion(t *testing.T) {
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		ok   bool
		want string
	}{
		{"installed", &debug.BuildInfo{Main: debug.Module{Path: "github.com/watermill-idempotency/idempotency/cmd/idem", Version: "v0.3.1"}}, true, "v0.3.1"},
		{"clone", &debug.BuildInfo{Main: debug.Module{Path: "github.com/watermill-idempotency/idempotency/cmd/idem", Version: "(devel)"}}, true, "(devel)"},
		{"no version", &debug.BuildInfo{}, true, "(devel)"},
		{"no build info", nil, false, "(devel)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			saved := readBuildInfo
			t.Cleanup(func() { readBuildInfo = saved })
			readBuildInfo = func() (*debug.BuildInfo, bool) { return tc.info, tc.ok }
			var stdout, stderr bytes.Buffer
			if code := run([]string{"version"}, strings.NewReader(""), &stdout, &stderr); code != exitOK {
				t.Fatalf("exit %d, stderr %q", code, stderr.String())
			}
			if got := stdout.String(); got != tc.want+"\n" {
				t.Errorf("printed %q, want %q", got, tc.want+"\n")
			}
		})
	}
}

func TestVersionTakesNoArguments(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"version", "extra"}, strings.NewReader(""), &stdout, &stderr); code != exitError {
		t.Errorf("exit %d, want %d; stderr %q", code, exitError, stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("printed %q", stdout.String())
	}
}
