package main

import (
	"context"
	"fmt"
	"regexp"
	"runtime/debug"
	"strings"
)

// readBuildInfo is debug.ReadBuildInfo; tests replace it.
var readBuildInfo = debug.ReadBuildInfo

// The commit a build from a clone was made from, and whether the tree had
// changes: `make idem` sets them (-ldflags -X), since the go command
// stamps no VCS information into a build in a workspace.
var (
	vcsRevision string
	vcsModified string
)

// releaseVersion is a version a tag names: vX.Y.Z, or a pre-release of it
// (vX.Y.Z-rc.1), without build metadata (+dirty).
var releaseVersion = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

// pseudoVersion is a version the go command makes up for a commit that no
// tag names (golang.org/x/mod/module's pattern): v0.0.0-20261201100000-
// 151d1ac1e2f3, v0.1.1-0.20261201100000-151d1ac1e2f3.
var pseudoVersion = regexp.MustCompile(`^v[0-9]+\.(0\.0-|[0-9]+\.[0-9]+-([^+]*\.)?0\.)[0-9]{14}-([A-Za-z0-9]+)(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)

// moduleVersion is the version of the module the binary was built from:
// v1.2.3 when installed with go install ...@v1.2.3 (or built from a
// clone at that tag, with no changes). Anything else is no release, and
// says so: "(devel)", with the commit when it is known, from the go
// command's stamp, the pseudo-version of go install ...@COMMIT, or
// `make idem`.
func moduleVersion() string {
	v, rev, modified := "", vcsRevision, vcsModified == "true"
	if info, ok := readBuildInfo(); ok {
		v = info.Main.Version
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				if rev == "" {
					rev = s.Value
				}
			case "vcs.modified":
				modified = modified || s.Value == "true"
			}
		}
	}
	if releaseVersion.MatchString(v) && !pseudoVersion.MatchString(v) {
		return v
	}
	modified = modified || strings.HasSuffix(v, "+dirty")
	if m := pseudoVersion.FindStringSubmatch(v); m != nil && rev == "" {
		rev = m[3]
	}
	out := "(devel)"
	if rev != "" {
		out += " built from commit " + rev[:min(len(rev), 12)]
	}
	if modified {
		out += ", with uncommitted changes"
	}
	if pseudoVersion.MatchString(v) {
		out += " (" + v + ")"
	}
	return out
}

var versionCmd = &command{
	name: "version",
	help: "print the version of the module idem was built from, or (devel) and the commit for a build of no release",
	run: func(_ context.Context, e *env, _ any, args []string) error {
		if err := exactArgs(args, 0, "no arguments"); err != nil {
			return err
		}
		fmt.Fprintln(e.stdout, moduleVersion())
		return nil
	},
}
