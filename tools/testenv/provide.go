package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
)

// dynaliteVersion is the dynalite release installed from npm.
const dynaliteVersion = "4.0.0"

// A program is one executable a service needs, and where it comes from.
type program struct {
	// names are the names it goes by, the preferred first.
	names []string
	// dirs are globs of directories to search besides PATH, where Debian
	// puts programs off a normal user's PATH.
	dirs []string
	// pkgs are the Debian and Ubuntu packages that install it.
	pkgs []string
	// dirsFirst searches dirs before PATH.
	dirsFirst bool
}

var (
	progRedisServer = &program{names: []string{"redis-server"}, pkgs: []string{"redis-server"}}
	progRedisCLI    = &program{names: []string{"redis-cli"}, pkgs: []string{"redis-tools"}}
	pgDirs          = []string{"/usr/lib/postgresql/*/bin"}
	progPostgres    = &program{names: []string{"postgres"}, dirs: pgDirs, pkgs: []string{"postgresql"}}
	progInitdb      = &program{names: []string{"initdb"}, dirs: pgDirs, pkgs: []string{"postgresql"}}
	progPgCtl       = &program{names: []string{"pg_ctl"}, dirs: pgDirs, pkgs: []string{"postgresql"}}
	progPsql        = &program{names: []string{"psql"}, dirs: pgDirs, pkgs: []string{"postgresql-client"}}
	sbin            = []string{"/usr/sbin", "/sbin", "/usr/local/sbin"}
	progMariadbd    = &program{names: []string{"mariadbd", "mysqld"}, dirs: sbin, pkgs: []string{"mariadb-server"}}
	progMariadbInit = &program{names: []string{"mariadb-install-db", "mysql_install_db"}, pkgs: []string{"mariadb-server"}}
	progMariadb     = &program{names: []string{"mariadb", "mysql"}, pkgs: []string{"mariadb-client"}}
	// Debian's /usr/sbin/rabbitmq-server switches to the rabbitmq user
	// and drops the environment; the script it runs does not.
	progRabbit = &program{names: []string{"rabbitmq-server"}, dirs: []string{"/usr/lib/rabbitmq/bin"}, dirsFirst: true, pkgs: []string{"rabbitmq-server"}}
	progEpmd   = &program{names: []string{"epmd"}, dirs: []string{"/usr/lib/erlang/bin"}, pkgs: []string{"rabbitmq-server"}}
	progNode   = &program{names: []string{"node", "nodejs"}, pkgs: []string{"nodejs"}}
	progNpm    = &program{names: []string{"npm"}, pkgs: []string{"npm"}}
	// prometheus and promtool: the tests of monitoring/ start a Prometheus
	// of their own and check its rules with promtool.
	progPrometheus = &program{names: []string{"prometheus"}, pkgs: []string{"prometheus"}}
	progPromtool   = &program{names: []string{"promtool"}, pkgs: []string{"prometheus"}}
	// go test -race needs cgo: a C compiler and the C library's headers.
	progCC = &program{names: []string{"gcc", "cc"}, pkgs: []string{"gcc", "libc6-dev"}}
)

// tools is where each program was found.
type tools struct {
	path map[*program]string
	// pgBin is the directory of the Postgres server programs.
	pgBin string
	// goaws, natsServer and dynalite are the programs provided here.
	goaws, natsServer, dynalite string
}

func (t *tools) bin(p *program) string { return t.path[p] }

// find looks for p on PATH, then in its extra directories (the newest
// first, for versioned ones), or the other way round.
func (p *program) find() (string, bool) {
	if p.dirsFirst {
		if path, ok := p.findInDirs(); ok {
			return path, true
		}
	}
	for _, name := range p.names {
		if path, err := exec.LookPath(name); err == nil {
			return path, true
		}
	}
	return p.findInDirs()
}

func (p *program) findInDirs() (string, bool) {
	for _, glob := range p.dirs {
		dirs, _ := filepath.Glob(glob)
		sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
		for _, dir := range dirs {
			for _, name := range p.names {
				path := filepath.Join(dir, name)
				if st, err := os.Stat(path); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
					return path, true
				}
			}
		}
	}
	return "", false
}

// provide makes sure every program the wanted services need is there,
// installing what is missing where it can, and builds the servers that
// come from Go modules and npm.
func provide(ctx context.Context, root string, wanted []*service, cc bool) (*tools, error) {
	var need []*program
	for _, s := range wanted {
		for _, p := range s.programs {
			if !slices.Contains(need, p) {
				need = append(need, p)
			}
		}
	}
	if cc {
		need = append(need, progCC)
	}
	missing := func() (progs []*program) {
		for _, p := range need {
			if _, ok := p.find(); !ok || (p == progCC && !haveCHeaders()) {
				progs = append(progs, p)
			}
		}
		return progs
	}
	if m := missing(); len(m) > 0 {
		if err := install(ctx, m); err != nil {
			return nil, err
		}
		if m := missing(); len(m) > 0 {
			return nil, fmt.Errorf("still missing after the install: %s", names(m))
		}
	}
	t := &tools{path: map[*program]string{}}
	for _, p := range need {
		t.path[p], _ = p.find()
	}
	if pg := t.path[progPostgres]; pg != "" {
		t.pgBin = filepath.Dir(pg)
	}

	var goBuilt []string
	for _, s := range wanted {
		if s.goTool != "" {
			goBuilt = append(goBuilt, s.goTool)
		}
	}
	if len(goBuilt) > 0 {
		if err := buildGoTools(ctx, root, goBuilt); err != nil {
			return nil, err
		}
		t.goaws = filepath.Join(root, "bin", "goaws")
		t.natsServer = filepath.Join(root, "bin", "nats-server")
	}
	if slices.ContainsFunc(wanted, func(s *service) bool { return s.name == "dynamodb" }) {
		cli, err := installDynalite(ctx, root)
		if err != nil {
			return nil, err
		}
		t.dynalite = cli
	}
	return t, nil
}

func names(progs []*program) string {
	var out []string
	for _, p := range progs {
		out = append(out, p.names[0])
	}
	return strings.Join(out, ", ")
}

func packages(progs []*program) []string {
	var out []string
	for _, p := range progs {
		for _, pkg := range p.pkgs {
			if !slices.Contains(out, pkg) {
				out = append(out, pkg)
			}
		}
	}
	return out
}

// haveCHeaders reports whether the C library's headers are installed, as
// linking a program with cgo needs.
func haveCHeaders() bool {
	if runtime.GOOS != "linux" {
		return true
	}
	_, err := os.Stat("/usr/include/stdlib.h")
	return err == nil
}

// install installs progs with apt-get when testenv runs as root on Debian
// or Ubuntu, and otherwise returns an error that says how to.
func install(ctx context.Context, progs []*program) error {
	pkgs := packages(progs)
	aptLine := "apt-get install -y --no-install-recommends " + strings.Join(pkgs, " ")
	_, noApt := exec.LookPath("apt-get")
	switch {
	case debianLike() && noApt == nil && os.Geteuid() == 0:
		// Install them below.
	case debianLike() && noApt == nil:
		return fmt.Errorf("the tests need %s, which this machine lacks. Install them, then run the tests again:\n\n    sudo apt-get update && sudo %s", names(progs), aptLine)
	case runtime.GOOS == "darwin":
		return fmt.Errorf("the tests need %s, which this machine lacks. Install them (Homebrew: brew install redis postgresql@15 mariadb rabbitmq node prometheus; a C compiler: xcode-select --install), put them on PATH and run the tests again", names(progs))
	default:
		return fmt.Errorf("the tests need %s, which this machine lacks. Install them with the system's package manager (on Debian or Ubuntu: %s), put them on PATH and run the tests again", names(progs), aptLine)
	}

	logf("installing %s with apt-get: %s", names(progs), strings.Join(pkgs, " "))
	// Packages must not start their own services: the tests start private
	// ones. policy-rc.d says no to every service start during the install.
	const policy = "/usr/sbin/policy-rc.d"
	if _, err := os.Stat(policy); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(policy, []byte("#!/bin/sh\n# Written by testenv during a package install: start no service.\nexit 101\n"), 0o755); err != nil {
			return fmt.Errorf("write %s: %w", policy, err)
		}
		defer os.Remove(policy)
	}
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	for _, args := range [][]string{{"update", "-q"}, append([]string{"install", "-y", "-q", "--no-install-recommends"}, pkgs...)} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr // a long install shows its progress
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("apt-get %s: %v", args[0], err)
		}
	}
	return nil
}

// debianLike reports whether /etc/os-release names Debian or Ubuntu, or a
// distribution built on them.
func debianLike() bool {
	f, err := os.Open("/etc/os-release")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), "=")
		if !ok || (key != "ID" && key != "ID_LIKE") {
			continue
		}
		for id := range strings.FieldsSeq(strings.Trim(val, `"'`)) {
			if id == "debian" || id == "ubuntu" {
				return true
			}
		}
	}
	return false
}

// buildGoTools builds the Go-written servers from the versions pinned in
// tools/go.mod into bin/. Without cgo, so no C compiler is needed; the go
// command's cache makes a rebuild of an unchanged one quick.
func buildGoTools(ctx context.Context, root string, pkgs []string) error {
	goCmd := os.Getenv("GO")
	if goCmd == "" {
		goCmd = "go"
	}
	for _, pkg := range pkgs {
		out := filepath.Join(root, "bin", goToolName(pkg))
		cmd := exec.CommandContext(ctx, goCmd, "build", "-o", out, pkg)
		cmd.Dir = filepath.Join(root, "tools")
		cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s (tools/go.mod): %v\n%s", pkg, err, tail(b, 40))
		}
	}
	return nil
}

func goToolName(pkg string) string {
	switch {
	case strings.Contains(pkg, "goaws"):
		return "goaws"
	case strings.Contains(pkg, "nats-server"):
		return "nats-server"
	}
	return filepath.Base(pkg)
}

// installDynalite installs dynalite at its pinned version with npm into
// .cache/dynalite, unless it is there already, and returns its script.
func installDynalite(ctx context.Context, root string) (string, error) {
	prefix := filepath.Join(root, ".cache", "dynalite")
	pkgDir := filepath.Join(prefix, "node_modules", "dynalite")
	cli := filepath.Join(pkgDir, "cli.js")
	var meta struct{ Version string }
	if b, err := os.ReadFile(filepath.Join(pkgDir, "package.json")); err == nil && json.Unmarshal(b, &meta) == nil && meta.Version == dynaliteVersion {
		return cli, nil
	}
	logf("installing dynalite %s with npm into %s", dynaliteVersion, prefix)
	npm, _ := progNpm.find()
	cmd := exec.CommandContext(ctx, npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", prefix, "dynalite@"+dynaliteVersion)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm install dynalite@%s: %v\n%s", dynaliteVersion, err, tail(b, 40))
	}
	return cli, nil
}

// tail returns the last n lines of b.
func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
