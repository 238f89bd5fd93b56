package main

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

// idem version prints the module version go install stamped into the
// binary when it is a release, and (devel) for any other build, with the
// commit when it is known: a build from a clone claims no release.
func TestVersion(t *testing.T) {
	const path = "github.com/watermill-idempotency/idempotency/cmd/idem"
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "151d1ac1e2f3a9b8c7d6e5f4a3b2c1d0e9f8a7b6"
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		ok   bool
		// stamped is what `make idem` sets: revision and modified.
		stamped [2]string
		want    string
	}{
		{"installed", &debug.BuildInfo{Main: debug.Module{Path: path, Version: "v0.3.1"}}, true, [2]string{}, "v0.3.1"},
		{"installed pre-release", &debug.BuildInfo{Main: debug.Module{Path: path, Version: "v0.2.0-rc.1"}}, true, [2]string{}, "v0.2.0-rc.1"},
		{"clone at its tag", &debug.BuildInfo{Main: debug.Module{Path: path, Version: "v0.2.0"}, Settings: vcs(rev, "false")}, true, [2]string{}, "v0.2.0"},
		{"clone at its tag, changed", &debug.BuildInfo{Main: debug.Module{Path: path, Version: "v0.2.0+dirty"}, Settings: vcs(rev, "true")}, true, [2]string{},
			"(devel) built from commit 151d1ac1e2f3, with uncommitted changes"},
		{"clone after a tag", &debug.BuildInfo{Main: debug.Module{Path: path, Version: "v0.1.1-0.20261201100000-151d1ac1e2f3"}, Settings: vcs(rev, "false")}, true, [2]string{},
			"(devel) built from commit 151d1ac1e2f3 (v0.1.1-0.20261201100000-151d1ac1e2f3)"},
		{"go install of a commit", &debug.BuildInfo{Main: debug.Module{Path: path, Version: "v0.0.0-20261201100000-151d1ac1e2f3"}}, true, [2]string{},
			"(devel) built from commit 151d1ac1e2f3 (v0.0.0-20261201100000-151d1ac1e2f3)"},
		{"workspace", &debug.BuildInfo{Main: debug.Module{Path: path, Version: "(devel)"}}, true, [2]string{}, "(devel)"},
		{"workspace, make idem", &debug.BuildInfo{Main: debug.Module{Path: path, Version: "(devel)"}}, true, [2]string{"151d1ac1e2f3", "true"},
			"(devel) built from commit 151d1ac1e2f3, with uncommitted changes"},
		{"no version", &debug.BuildInfo{}, true, [2]string{}, "(devel)"},
		{"no build info", nil, false, [2]string{}, "(devel)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			saved, savedRev, savedModified := readBuildInfo, vcsRevision, vcsModified
			t.Cleanup(func() { readBuildInfo, vcsRevision, vcsModified = saved, savedRev, savedModified })
			readBuildInfo = func() (*debug.BuildInfo, bool) { return tc.info, tc.ok }
			vcsRevision, vcsModified = tc.stamped[0], tc.stamped[1]
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

// The binary the tests build from this clone, as go build builds it,
// claims no release.
func TestVersionOfACloneBuild(t *testing.T) {
	r := idem(t, nil, "", "version")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "(devel)") {
		t.Errorf("idem version of a build from a clone: exit %d, printed %q, want (devel)...", r.code, r.stdout)
	}
}
