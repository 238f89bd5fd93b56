// Package exampletest runs the examples as a user would: it builds an
// example's program, starts it with its configuration in the environment,
// reads what it prints while it runs, signals or kills it, and scrapes its
// /metrics. Only the examples' tests import it: the programs themselves
// use nothing from this repository's internal packages, and nothing from
// testing.
package exampletest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildMu  sync.Mutex
	buildDir string
	built    = map[string]string{}
)

// Main runs the package's tests and removes the programs Build made.
// Call it from TestMain: os.Exit(exampletest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	return code
}

// Build builds the main package in dir (relative to the test's working
// directory: "." for the package under test) once per test binary, with
// -race when the tests run with it, and returns the program's path.
func Build(t testing.TB, dir string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if bin, ok := built[abs]; ok {
		return bin
	}
	if buildDir == "" {
		if buildDir, err = os.MkdirTemp("", "idem-examples-"); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(buildDir, filepath.Base(abs))
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	// go test puts its own go command first in PATH.
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Dir = abs
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), abs, err, out)
	}
	t.Logf("built %s in %.1fs (race: %v)", filepath.Base(abs), time.Since(start).Seconds(), raceEnabled)
	built[abs] = bin
	return bin
}

// Process is a running example program.
type Process struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd

	mu      sync.Mutex
	out     bytes.Buffer
	changed chan struct{} // closed and replaced whenever out grows or the process exits
	exited  bool
	waitErr error
}

// Start starts the program bin with args, in the test's environment plus
// env ("NAME=value", taking precedence). name tells its output apart in
// the test's log. The process is killed, if still running, when the test
// ends, and its output logged.
func Start(t testing.TB, name, bin string, args []string, env ...string) *Process {
	t.Helper()
	p := &Process{t: t, name: name, changed: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	w := writerFunc(p.write)
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		err := p.cmd.Wait()
		p.mu.Lock()
		p.exited, p.waitErr = true, err
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}()
	t.Cleanup(func() {
		if !p.hasExited() {
			_ = p.cmd.Process.Kill()
			p.wait(30 * time.Second)
		}
		t.Logf("output of %s:\n%s", name, p.Output())
	})
	return p
}

type writerFunc func(b []byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func (p *Process) write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out.Write(b)
	close(p.changed)
	p.changed = make(chan struct{})
	return len(b), nil
}

// Output is everything the process printed so far, stdout and stderr
// interleaved as written.
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *Process) hasExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// WaitFor waits up to timeout for a complete line of output matching re,
// and returns its submatches. It fails the test if none comes, or if the
// process exits first.
func (p *Process) WaitFor(re *regexp.Regexp, timeout time.Duration) []string {
	p.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		exited, changed := p.exited, p.changed
		p.mu.Unlock()
		if m := p.Find(re); m != nil {
			return m
		}
		if exited {
			p.t.Fatalf("%s exited before printing a line matching %q", p.name, re)
		}
		select {
		case <-changed:
		case <-deadline.C:
			p.t.Fatalf("%s printed no line matching %q within %v", p.name, re, timeout)
		}
	}
}

// Find returns the submatches of the first complete line of output so far
// that matches re, or nil.
func (p *Process) Find(re *regexp.Regexp) []string {
	out := p.Output()
	i := strings.LastIndexByte(out, '\n')
	if i < 0 {
		return nil
	}
	for _, line := range strings.Split(out[:i], "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			return m
		}
	}
	return nil
}

// WaitForAny waits up to timeout for one of procs to print a line matching
// re, and returns that process and the line's submatches. It fails the
// test if none does.
func WaitForAny(t testing.TB, procs []*Process, re *regexp.Regexp, timeout time.Duration) (*Process, []string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, p := range procs {
			if m := p.Find(re); m != nil {
				return p, m
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no process printed a line matching %q within %v", re, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Lines returns the lines of output matching re so far.
func (p *Process) Lines(re *regexp.Regexp) []string {
	var out []string
	for _, line := range strings.Split(p.Output(), "\n") {
		if re.MatchString(line) {
			out = append(out, line)
		}
	}
	return out
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil && !p.hasExited() {
		p.t.Fatalf("signalling %s: %v", p.name, err)
	}
}

// Kill kills the process outright (SIGKILL), as a crash would, and waits
// for it to be gone.
func (p *Process) Kill() {
	p.t.Helper()
	_ = p.cmd.Process.Kill()
	if !p.wait(30 * time.Second) {
		p.t.Fatalf("%s still runs 30s after SIGKILL", p.name)
	}
}

// Wait waits up to timeout for the process to exit and returns its exit
// status. It fails the test if the process is still running then.
func (p *Process) Wait(timeout time.Duration) int {
	p.t.Helper()
	if !p.wait(timeout) {
		p.t.Fatalf("%s still runs after %v", p.name, timeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var exit *exec.ExitError
	switch {
	case p.waitErr == nil:
		return 0
	case errors.As(p.waitErr, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return exit.ExitCode()
	}
	p.t.Fatalf("%s: %v", p.name, p.waitErr)
	return -1
}

func (p *Process) wait(timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		exited, changed := p.exited, p.changed
		p.mu.Unlock()
		if exited {
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
		}
	}
}

// EndsWithVerdict returns an error unless out ends with the example's
// summary (a line "Summary:", then its sums, each adding up: see
// [ParseSummary]) followed by a line starting with check: nothing, an
// error least of all, may be printed after an example's summary and
// verdict.
func EndsWithVerdict(out, check string) error {
	_, err := ParseSummary(out, check)
	return err
}
