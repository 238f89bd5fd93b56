package main

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// pidFile, in a run's directory, holds the process id of its testenv.
const pidFile = "testenv.pid"

// reapStale stops the servers of runs whose testenv was killed before it
// could (a SIGKILL, a closed terminal), and removes their directories. The
// kernel ends a killed testenv's own children (Linux), but not what they
// started, such as RabbitMQ's Erlang node; those are found by their working
// directory, which is in the run's directory.
func reapStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "idem-test-*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, pidFile))
		if err != nil {
			continue // not a run's directory, or one being created
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || alive(pid) {
			continue
		}
		n := killInside(dir)
		if err := os.RemoveAll(dir); err != nil {
			logf("removing the directory of an interrupted run, %s: %v", dir, err)
			continue
		}
		logf("removed an interrupted run's directory %s (stopped %d of its processes)", dir, n)
	}
}

// alive reports whether a process with the id exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// killInside kills every process whose working directory is dir or below
// it, and returns how many. Linux only: elsewhere it finds none.
func killInside(dir string) int {
	procs, _ := os.ReadDir("/proc")
	n := 0
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", p.Name(), "cwd"))
		if err != nil || (cwd != dir && !strings.HasPrefix(cwd, dir+string(filepath.Separator))) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}
