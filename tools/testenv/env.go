package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// startTimeout bounds each server's start; Erlang and Node start slowly on
// a loaded machine.
const startTimeout = 2 * time.Minute

// env is one run's servers.
type env struct {
	root  string
	tools *tools
	dir   string // the temporary directory of every server's data
	run   string // this run's id
	keep  bool   // keep dir at close

	mu       sync.Mutex
	procs    []*proc
	values   map[*service]string
	notes    map[*service]string
	cleanups []func()
	ports    map[int]bool
}

func newEnv(root string, t *tools) (*env, error) {
	dir, err := os.MkdirTemp("", "idem-test-")
	if err != nil {
		return nil, err
	}
	// Servers that run as another user (Postgres, when testenv runs as
	// root) must reach their directories inside.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	// A killed testenv cannot stop its servers; the next one does (stale).
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	run := "r" + strconv.FormatInt(time.Now().UnixNano()/1e6%(36*36*36*36*36*36), 36) + strconv.FormatInt(int64(os.Getpid()%1296), 36)
	return &env{root: root, tools: t, dir: dir, run: run, values: map[*service]string{}, notes: map[*service]string{}, ports: map[int]bool{}}, nil
}

// start provides every wanted service: the user's where its variable is
// set, a private one otherwise. The private ones start side by side.
func (e *env) start(ctx context.Context, wanted []*service) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	errs := make([]error, len(wanted))
	var wg sync.WaitGroup
	for i, s := range wanted {
		wg.Go(func() {
			var (
				value string
				err   error
			)
			if given := os.Getenv(s.envVar); given != "" {
				value, err = s.shared(ctx, e, given)
				e.note(s, "yours")
			} else {
				value, err = s.start(ctx, e)
			}
			if err != nil {
				errs[i] = fmt.Errorf("%s (%s): %w", s.name, s.envVar, err)
				return
			}
			e.mu.Lock()
			e.values[s] = value
			e.mu.Unlock()
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (e *env) note(s *service, n string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.notes[s] = n
}

// vars is the environment the command gets.
func (e *env) vars() []string {
	out := []string{"IDEM_TEST_RUN=" + e.run}
	for _, s := range allServices {
		if v, ok := e.values[s]; ok {
			out = append(out, s.envVar+"="+v)
		}
	}
	if e.tools.pgBin != "" {
		out = append(out, "PATH="+os.Getenv("PATH")+string(os.PathListSeparator)+e.tools.pgBin)
	}
	return out
}

// summary names each service and its address.
func (e *env) summary() []string {
	var out []string
	for _, s := range allServices {
		v, ok := e.values[s]
		if !ok {
			continue
		}
		if n := e.notes[s]; n != "" {
			v += " (" + n + ")"
		}
		out = append(out, s.name+" "+redact(v))
	}
	return out
}

// redact hides a password in a URL or DSN.
func redact(v string) string {
	if i := strings.Index(v, "://"); i >= 0 {
		rest := v[i+3:]
		if at := strings.Index(rest, "@"); at >= 0 {
			if colon := strings.Index(rest[:at], ":"); colon >= 0 {
				return v[:i+3] + rest[:colon] + ":xxxxx" + rest[at:]
			}
		}
		return v
	}
	if at := strings.LastIndex(v, "@"); at >= 0 {
		if colon := strings.Index(v[:at], ":"); colon >= 0 {
			return v[:colon] + ":xxxxx" + v[at:]
		}
	}
	return v
}

// close runs the cleanups, stops every server and removes the data.
func (e *env) close() {
	e.mu.Lock()
	cleanups, procs := e.cleanups, e.procs
	e.mu.Unlock()
	for _, c := range slices.Backward(cleanups) {
		c()
	}
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(p.stop)
	}
	wg.Wait()
	if e.keep {
		logf("the servers' data and logs are in %s", e.dir)
		return
	}
	if err := os.RemoveAll(e.dir); err != nil {
		logf("remove %s: %v", e.dir, err)
	}
}

// onClose registers a cleanup of a user's server.
func (e *env) onClose(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cleanups = append(e.cleanups, f)
}

// subdir makes a directory for one server's data.
func (e *env) subdir(name string) (string, error) {
	d := filepath.Join(e.dir, name)
	return d, os.MkdirAll(d, 0o755)
}

// port returns a loopback port that was free a moment ago and that no
// other server of this run was given; if also is not zero, the port that
// far above it must be free too.
func (e *env) port(also int) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		ok := true
		if also != 0 {
			if p+also > 65535 {
				ok = false
			} else if l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+also)); err != nil {
				ok = false
			} else {
				l2.Close()
			}
		}
		l.Close()
		e.mu.Lock()
		if ok && !e.ports[p] && (also == 0 || !e.ports[p+also]) {
			e.ports[p] = true
			if also != 0 {
				e.ports[p+also] = true
			}
			e.mu.Unlock()
			return p, nil
		}
		e.mu.Unlock()
	}
	return 0, errors.New("no free port")
}

// proc is a running server.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	stopSig syscall.Signal
	exited  chan struct{}
}

// spawn starts cmd in a process group of its own (so that a Ctrl-C meant
// for the tests does not kill it before its turn), its output into a log
// file, killed if testenv dies. It is stopped with stopSig at close.
func (e *env) spawn(name string, cmd *exec.Cmd, stopSig syscall.Signal) (*proc, error) {
	logPath := filepath.Join(e.dir, name+".log")
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	setDeathSignal(cmd.SysProcAttr)
	if cmd.Dir == "" {
		cmd.Dir = e.dir // so that a stale one is known by its working directory
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, stopSig: stopSig, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	return p, nil
}

// stop signals the process group, waits up to ten seconds, then kills
// whatever of the group is left.
func (p *proc) stop() {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, p.stopSig)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		logf("%s did not stop in 10s: killing it", p.name)
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.exited
}

// log returns the end of the process's log.
func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return tail(b, 30)
}

// waitReady calls ready until it succeeds, the process exits or ctx ends.
func (p *proc) waitReady(ctx context.Context, ready func(context.Context) error) error {
	var last error
	for {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited while starting: %v\n%s", p.name, p.cmd.ProcessState, p.log())
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		last = ready(cctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %v\n%s", p.name, last, p.log())
		case <-p.exited:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dialReady is ready when addr accepts a connection and, if hello is not
// nil, hello succeeds on it.
func dialReady(addr string, hello func(net.Conn) error) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		if hello != nil {
			return hello(c)
		}
		return nil
	}
}

// command runs a client program to completion and returns its output.
func command(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// retry calls f until it succeeds or ctx ends.
func retry(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
