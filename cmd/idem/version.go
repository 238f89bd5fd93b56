package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

// readBuildInfo is debug.ReadBuildInfo; tests replace it.
var readBuildInfo = debug.ReadBuildInfo

// moduleVersion is the version of the module the binary was built from:
// v1.2.3 when installed with go install ...@v1.2.3, (devel) when built
// from a clone.
func moduleVersion() string {
	info, ok := readBuildInfo()
	if !ok || info.Main.Version == "" {
		return "(devel)"
	}
	return info.Main.Version
}

var versionCmd = &command{
	name: "version",
	help: "print the version of the module idem was built from",
	run: func(_ context.Context, e *env, _ any, args []string) error {
		if err := exactArgs(args, 0, "no arguments"); err != nil {
			return err
		}
		fmt.Fprintln(e.stdout, moduleVersion())
		return nil
	},
}
