package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// goBin is the go command: $GO, else go from PATH.
func goBin() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	return "go"
}

// cmdError is a failed command, with its output.
type cmdError struct {
	where string // the module or directory it ran for
	cmd   string
	err   error
	out   string
}

func (e *cmdError) Error() string {
	out := strings.TrimRight(e.out, "\n")
	if out != "" {
		out = "\n" + indent(out)
	}
	return fmt.Sprintf("%s: `%s` failed: %v%s", e.where, e.cmd, e.err, out)
}

func indent(s string) string { return "    " + strings.ReplaceAll(s, "\n", "\n    ") }

// runner runs commands with one environment.
type runner struct {
	env []string // full environment
}

// verbose logs every command with the time it took.
var verbose bool

// withEnv returns the environment base with the variables of set
// replacing any of the same name.
func withEnv(base []string, set map[string]string) []string {
	var out []string
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			out = append(out, kv)
		}
	}
	for k, v := range set {
		out = append(out, k+"="+v)
	}
	return out
}

// run runs name args in dir and returns its standard output; on failure
// the error carries the combined output.
func (r *runner) run(ctx context.Context, where, dir string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = r.env
	var stdout, both bytes.Buffer
	cmd.Stdout = io.MultiWriter(&stdout, &both)
	cmd.Stderr = &both
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	err := cmd.Run()
	if verbose {
		logf("    %s: %s  %s", where, shellQuote(append([]string{filepath.Base(name)}, args...)), since(start))
	}
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return stdout.String(), &cmdError{where: where, cmd: shellQuote(append([]string{filepath.Base(name)}, args...)), err: err, out: both.String()}
	}
	return stdout.String(), nil
}

func (r *runner) goCmd(ctx context.Context, where, dir string, args ...string) (string, error) {
	return r.run(ctx, where, dir, goBin(), args...)
}

func shellQuote(args []string) string {
	var out []string
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"$^*?[]{}()|&;<>\\`") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// hostGoEnv reads variables of the go command as the user has it.
func hostGoEnv(ctx context.Context, dir string, names ...string) (map[string]string, error) {
	r := &runner{env: os.Environ()}
	out, err := r.goCmd(ctx, "go env", dir, append([]string{"env", "-json"}, names...)...)
	if err != nil {
		return nil, err
	}
	vals := map[string]string{}
	if err := json.Unmarshal([]byte(out), &vals); err != nil {
		return nil, fmt.Errorf("go env -json: %w", err)
	}
	return vals, nil
}

// extractHEAD writes the tree of commit rev, as git archive gives it (the
// tracked files only), into dst.
func extractHEAD(ctx context.Context, repo, rev, dst string) error {
	cmd := exec.CommandContext(ctx, "git", "archive", "--format=tar", rev)
	cmd.Dir = repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	xerr := untar(pipe, dst)
	_, _ = io.Copy(io.Discard, pipe)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %v: %s", rev, err, stderr.String())
	}
	return xerr
}

func untar(r io.Reader, dst string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Join(dst, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(name, dst+string(filepath.Separator)) && name != dst {
			return fmt.Errorf("archive entry %q escapes the directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fs.FileMode(h.Mode)&0o777|0o600)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, name); err != nil {
				return err
			}
		case tar.TypeXGlobalHeader:
		default:
			return fmt.Errorf("archive entry %q: unexpected type %c", h.Name, h.Typeflag)
		}
	}
}

// removeAll removes dir, making read-only directories (a module cache
// written without -modcacherw) writable first.
func removeAll(dir string) error {
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// parallel runs fn for every item, at most n at once, and returns every
// error, in the items' order.
func parallel[T any](ctx context.Context, n int, items []T, fn func(context.Context, T) error) error {
	errs := make([]error, len(items))
	sem := make(chan struct{}, max(n, 1))
	var wg sync.WaitGroup
	for i, it := range items {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			errs[i] = fn(ctx, it)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// logf prints a progress line.
var logMu sync.Mutex

func logf(format string, args ...any) {
	logMu.Lock()
	defer logMu.Unlock()
	fmt.Fprintf(os.Stderr, "release: "+format+"\n", args...)
}

func since(t time.Time) string { return time.Since(t).Round(100 * time.Millisecond).String() }
