package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// checkModules runs, in every module of the copy, without the workspace:
// go mod tidy -diff, and go vet, which type-checks every package and its
// tests against the module's own requirements. make test has compiled and
// linked every test already, in the workspace: what only this copy can
// show is that each module's go.mod is enough on its own, and vet shows it
// without linking a test binary per package again.
func (r *release) checkModules(ctx context.Context) error {
	goCmd := &runner{env: withEnv(os.Environ(), r.goenv)}
	return parallel(ctx, r.o.jobs, r.ws.Mods, func(ctx context.Context, m *mod) error {
		t := time.Now()
		for _, args := range [][]string{
			{"mod", "tidy", "-diff"},
			{"vet", "./..."},
		} {
			if _, err := goCmd.goCmd(ctx, m.Dir+" (module "+m.Path+", GOWORK=off)", r.dir(m), args...); err != nil {
				return err
			}
		}
		logf("  %-22s tidy -diff, vet  %s", m.Dir, since(t))
		return nil
	})
}

// checkInstall installs every module as a user would: from a module
// outside the repository, with a GOPATH and module cache of its own, from
// the proxy. Then it installs the idem command with go install and runs
// idem version.
func (r *release) checkInstall(ctx context.Context) error {
	scratch := filepath.Join(r.tmp, "scratch")
	env := map[string]string{}
	for k, v := range r.goenv {
		env[k] = v
	}
	env["GOPATH"] = filepath.Join(scratch, "gopath")
	env["GOMODCACHE"] = filepath.Join(scratch, "gopath", "pkg", "mod")
	env["GOBIN"] = filepath.Join(scratch, "bin")
	goCmd := &runner{env: withEnv(os.Environ(), env)}

	type job struct {
		m   *mod
		dir string
	}
	var jobs []job
	for i, m := range r.ws.Mods {
		jobs = append(jobs, job{m, filepath.Join(scratch, "mod"+strconv.Itoa(i))})
	}
	err := parallel(ctx, r.o.jobs, jobs, func(ctx context.Context, j job) error {
		t := time.Now()
		if err := os.MkdirAll(j.dir, 0o755); err != nil {
			return err
		}
		where := j.m.Path + " (from a scratch module outside the repository)"
		mv := j.m.Path + "@" + r.version
		if _, err := goCmd.goCmd(ctx, where, j.dir, "mod", "init", "example.com/scratch"); err != nil {
			return err
		}
		if _, err := goCmd.goCmd(ctx, where, j.dir, "get", mv); err != nil {
			return err
		}
		// The module's own packages, not those of a sibling it requires.
		out, err := goCmd.goCmd(ctx, where, j.dir, "list", "-e", "-f", `{{if and .Module (eq .Module.Path "`+j.m.Path+`") (or .GoFiles .CgoFiles)}}{{.ImportPath}}{{end}}`, j.m.Path+"/...")
		if err != nil {
			return err
		}
		pkgs := strings.Fields(out)
		if len(pkgs) == 0 {
			return fmt.Errorf("%s: no package of %s found", where, mv)
		}
		// go get of the packages adds the sums of what they import, as a
		// user's go get of a package does.
		get := []string{"get"}
		for _, p := range pkgs {
			get = append(get, p+"@"+r.version)
		}
		if _, err := goCmd.goCmd(ctx, where, j.dir, get...); err != nil {
			return err
		}
		if _, err := goCmd.goCmd(ctx, where, j.dir, append([]string{"build"}, pkgs...)...); err != nil {
			return err
		}
		logf("  %-22s go get, go build (%d packages)  %s", j.m.Dir, len(pkgs), since(t))
		return nil
	})
	if err != nil {
		return err
	}

	idem := r.ws.byPath[r.ws.rootPath()+"/cmd/idem"]
	if idem == nil {
		return nil
	}
	t := time.Now()
	cmdPath := idem.Path + "@" + r.version
	where := "go install " + cmdPath + " (outside any module)"
	if _, err := goCmd.goCmd(ctx, where, scratch, "install", cmdPath); err != nil {
		return err
	}
	bin := filepath.Join(env["GOBIN"], "idem")
	plain := &runner{env: []string{"PATH=" + os.Getenv("PATH"), "HOME=" + scratch}}
	out, err := plain.run(ctx, bin+" version", scratch, bin, "version")
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(out); got != r.version {
		return fmt.Errorf("%s version printed %q, want %q", cmdPath, got, r.version)
	}
	logf("  %-22s go install, idem version = %s  %s", idem.Dir, r.version, since(t))
	return nil
}
