// Command release prepares a release of every module of the repository,
// or checks that one would work:
//
//	release -version vX.Y.Z   move CHANGELOG.md's [Unreleased] entries to
//	                          [X.Y.Z], set the documents' install lines, every
//	                          sibling require and go.work to vX.Y.Z, in the
//	                          working tree, and print the commit and tags
//	release -check [-version vX.Y.Z]
//	                          the same in a copy of HEAD, then vet every
//	                          module (tests included) without the workspace,
//	                          and install every module from outside the
//	                          repository, as a user would; the version
//	                          defaults to the one CHANGELOG.md names next
//	release -next             print the version CHANGELOG.md names next, and why
//	release -tidy             go mod tidy every module of the working tree,
//	                          which the go command cannot do in the workspace
//	                          while the siblings' version is unpublished
//
// Both work in a copy of HEAD (git archive, so nothing untracked gets into
// a module), and serve the modules at the version from a module proxy of
// their own, so that go mod tidy and go get can resolve them before
// anything is published. See docs/releasing.md.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/mod/module"
)

func main() {
	var o options
	flag.StringVar(&o.version, "version", "", "the version, vX.Y.Z (with -check: default the version CHANGELOG.md names next: release -next)")
	flag.BoolVar(&o.check, "check", false, "check HEAD in a temporary copy; change nothing")
	flag.BoolVar(&o.next, "next", false, "print the version CHANGELOG.md (at HEAD) names next, and why")
	flag.StringVar(&o.date, "date", time.Now().UTC().Format(time.DateOnly), "the release's date in CHANGELOG.md")
	flag.BoolVar(&o.tidy, "tidy", false, "go mod tidy every module of the working tree, its uncommitted changes included")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory, and print where it is")
	flag.BoolVar(&verbose, "v", false, "print every command with the time it took")
	flag.IntVar(&o.jobs, "j", min(runtime.NumCPU(), 4), "modules worked on at once")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: release -version vX.Y.Z\n       release -check [-version vX.Y.Z]\n       release -next\n       release -tidy\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	modes := 0
	for _, on := range []bool{o.check, o.tidy, o.next, !o.check && o.version != ""} {
		if on {
			modes++
		}
	}
	if flag.NArg() > 0 || modes != 1 || (o.version != "" && (o.tidy || o.next)) {
		flag.Usage()
		os.Exit(2)
	}
	if _, err := time.Parse(time.DateOnly, o.date); err != nil {
		fmt.Fprintf(os.Stderr, "release: -date %q: want YYYY-MM-DD\n", o.date)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if o.next {
		err = printNext(ctx)
	} else {
		err = run(ctx, o)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "release: FAILED:", err)
		os.Exit(1)
	}
}

type options struct {
	version string
	check   bool
	tidy    bool
	next    bool
	date    string
	keep    bool
	jobs    int
}

// printNext prints the version HEAD's CHANGELOG.md names next, and why.
func printNext(ctx context.Context) error {
	git := &runner{env: os.Environ()}
	data, err := git.run(ctx, "git", ".", "git", "show", "HEAD:CHANGELOG.md")
	if err != nil {
		return err
	}
	cl, err := parseChangelog([]byte(data))
	if err != nil {
		return err
	}
	v, why := cl.next()
	fmt.Printf("%s: %s\n", v, why)
	return nil
}

// release is one run's state.
type release struct {
	o       options
	repo    string // the working tree
	tmp     string
	src     string // the copy of HEAD
	proxy   string // the file module proxy
	version string
	ws      *workspace
	cl      *changelog
	// docs are the documents prepare changed: CHANGELOG.md and those
	// whose install lines it set to the version.
	docs  []string
	order [][]*mod
	head  string    // HEAD's commit hash
	when  time.Time // HEAD's commit time, for the .info files
	goenv map[string]string
}

func run(ctx context.Context, o options) error {
	start := time.Now()
	git := &runner{env: os.Environ()}
	top, err := git.run(ctx, "git", ".", "git", "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	r := &release{o: o, repo: strings.TrimSpace(top)}
	status, err := git.run(ctx, "git", r.repo, "git", "status", "--porcelain")
	if err != nil {
		return err
	}
	if status != "" && !o.tidy {
		if !o.check {
			return fmt.Errorf("the working tree is not clean; the module zips must hold exactly what the tags will:\n%s", indent(strings.TrimRight(status, "\n")))
		}
		logf("note: the working tree has changes; this checks HEAD, without them")
	}
	head, err := git.run(ctx, "git", r.repo, "git", "log", "-1", "--format=%H %cI")
	if err != nil {
		return err
	}
	hash, when, _ := strings.Cut(strings.TrimSpace(head), " ")
	r.head = hash
	if r.when, err = time.Parse(time.RFC3339, when); err != nil {
		return fmt.Errorf("HEAD's commit time %q: %v", when, err)
	}
	tagList, err := git.run(ctx, "git", r.repo, "git", "tag", "--list")
	if err != nil {
		return err
	}
	tags := strings.Fields(tagList)

	host, err := hostGoEnv(ctx, r.repo, "GOMODCACHE", "GOPROXY")
	if err != nil {
		return err
	}

	if r.tmp, err = os.MkdirTemp("", "idem-release-"); err != nil {
		return err
	}
	if o.keep {
		defer logf("kept %s", r.tmp)
	} else {
		defer func() {
			if err := removeAll(r.tmp); err != nil {
				logf("removing %s: %v", r.tmp, err)
			}
		}()
	}
	r.src = filepath.Join(r.tmp, "src")
	r.proxy = filepath.Join(r.tmp, "proxy")
	if o.tidy {
		err = copyWorkingTree(ctx, r.repo, r.src)
	} else {
		err = extractHEAD(ctx, r.repo, r.head, r.src)
	}
	if err != nil {
		return err
	}
	work, err := os.ReadFile(filepath.Join(r.src, "go.work"))
	if err != nil {
		return err
	}
	r.ws, err = parseWorkspace(work, func(dir string) ([]byte, error) {
		return os.ReadFile(filepath.Join(r.src, filepath.FromSlash(dir), "go.mod"))
	})
	if err != nil {
		return err
	}
	if p := r.ws.problems(); len(p) > 0 {
		return fmt.Errorf("the modules cannot be released as they are:\n%s", indent(strings.Join(p, "\n")))
	}
	var why string
	switch {
	case o.tidy:
		// The version the siblings are required at, served from this tree.
		if r.version, err = requiredVersion(r.ws); err != nil {
			return err
		}
		why = "the version the siblings are required at"
	default:
		changes, err := os.ReadFile(filepath.Join(r.src, "CHANGELOG.md"))
		if err != nil {
			return err
		}
		if r.cl, err = parseChangelog(changes); err != nil {
			return err
		}
		if !o.check && o.version == "" {
			return errors.New("a release needs its version: -version vX.Y.Z (release -next prints the one CHANGELOG.md names)")
		}
		if r.version, why, err = chooseVersion(r.cl, o.version); err != nil {
			return err
		}
		if o.check {
			break
		}
		var exist []string
		for _, m := range r.ws.Mods {
			if t := tagName(m.Dir, r.version); slices.Contains(tags, t) {
				exist = append(exist, t)
			}
		}
		if len(exist) > 0 {
			return fmt.Errorf("already tagged: %s", strings.Join(exist, " "))
		}
	}
	if r.order, err = r.ws.layers(); err != nil {
		return err
	}
	what := map[bool]string{true: "check of HEAD " + hash[:12], false: "release of HEAD " + hash[:12]}[o.check]
	if o.tidy {
		what = "tidy of the working tree"
	}
	logf("%s at %s (%s), %d modules", what, r.version, why, len(r.ws.Mods))

	// The go commands' environment. -trimpath keeps the (new every run)
	// module cache's path out of the build cache's keys, so that what an
	// earlier run compiled is reused: without it every run compiles every
	// dependency again.
	r.goenv = map[string]string{
		"GOWORK":      "off",
		"GOFLAGS":     "-modcacherw -trimpath",
		"GOMODCACHE":  filepath.Join(r.tmp, "gomodcache"),
		"GOPROXY":     "file://" + filepath.ToSlash(r.proxy) + ",file://" + filepath.ToSlash(filepath.Join(host["GOMODCACHE"], "cache", "download")) + "," + host["GOPROXY"],
		"GONOSUMDB":   r.ws.rootPath(),
		"GOTOOLCHAIN": "local",
		"GO111MODULE": "on",
	}
	if host["GOPROXY"] == "" {
		r.goenv["GOPROXY"] = strings.TrimSuffix(r.goenv["GOPROXY"], ",")
	}

	t := time.Now()
	if err := r.prepare(ctx); err != nil {
		return err
	}
	logf("tidied, zipped and served every module in %s", since(t))
	if o.tidy {
		return r.writeTidied()
	}

	if !o.check {
		// Nothing may have moved under the copy meanwhile.
		now, err := git.run(ctx, "git", r.repo, "git", "rev-parse", "HEAD")
		if err != nil {
			return err
		}
		status, err := git.run(ctx, "git", r.repo, "git", "status", "--porcelain")
		if err != nil {
			return err
		}
		if strings.TrimSpace(now) != r.head || status != "" {
			return errors.New("the working tree changed while the release was prepared; run it again")
		}
		return r.writeBack()
	}
	t = time.Now()
	if err := r.checkModules(ctx); err != nil {
		return err
	}
	logf("tidy -diff and vet passed in %s", since(t))
	if !o.keep {
		// The copy's module cache is done with: remove it while the
		// installs run.
		gone := make(chan struct{})
		go func() {
			defer close(gone)
			_ = removeAll(r.goenv["GOMODCACHE"])
		}()
		defer func() { <-gone }()
	}
	t = time.Now()
	if err := r.checkInstall(ctx); err != nil {
		return err
	}
	logf("every module installed from outside the repository in %s", since(t))
	logf("check of %s passed in %s", r.version, since(start))
	return nil
}

// prepare sets every sibling require and go.work's replace lines to the
// version in the copy, and, for a release or its check, moves
// CHANGELOG.md's unreleased entries to the version's section and sets
// the documents' install lines to it; then it tidies, zips and serves the
// modules in dependency order.
func (r *release) prepare(ctx context.Context) error {
	if r.cl != nil {
		if err := r.prepareDocs(); err != nil {
			return err
		}
	}
	for _, m := range r.ws.Mods {
		name := filepath.Join(r.src, filepath.FromSlash(m.Dir), "go.mod")
		data, err := rewriteGoMod(path.Join(m.Dir, "go.mod"), m.Data, r.ws.isSibling, r.version)
		if err != nil {
			return err
		}
		if err := os.WriteFile(name, data, 0o644); err != nil {
			return err
		}
		// The siblings' sums are of the zips this run serves, not of
		// those a go.sum recorded: HEAD checked as the newest release
		// (nothing under [Unreleased]), or a working tree tidied at the
		// version its siblings are required at, may differ from what was
		// tagged. A tidy writes the recorded ones back (tidySum).
		sum := filepath.Join(r.src, filepath.FromSlash(m.Dir), "go.sum")
		old, err := readOptional(sum)
		if err != nil {
			return err
		}
		if old == nil {
			continue
		}
		kept := strings.Join(foreignSumLines(old, r.ws.isSibling), "\n")
		if kept != "" {
			kept += "\n"
		}
		if err := os.WriteFile(sum, []byte(kept), 0o644); err != nil {
			return err
		}
	}
	work, err := rewriteGoWork(r.ws.WorkData, r.ws.Mods, r.version)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.src, "go.work"), work, 0o644); err != nil {
		return err
	}
	goCmd := &runner{env: withEnv(os.Environ(), r.goenv)}
	for _, layer := range r.order {
		err := parallel(ctx, r.o.jobs, layer, func(ctx context.Context, m *mod) error {
			return r.tidyAndServe(ctx, goCmd, m)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *release) dir(m *mod) string { return filepath.Join(r.src, filepath.FromSlash(m.Dir)) }

// tidyAndServe runs go mod tidy in m, which must change nothing but the
// sibling versions, then puts m into the proxy.
func (r *release) tidyAndServe(ctx context.Context, goCmd *runner, m *mod) error {
	t := time.Now()
	dir := r.dir(m)
	modBefore, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	sumBefore, err := readOptional(filepath.Join(dir, "go.sum"))
	if err != nil {
		return err
	}
	if _, err := goCmd.goCmd(ctx, m.Path, dir, "mod", "tidy"); err != nil {
		return err
	}
	modAfter, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	sumAfter, err := readOptional(filepath.Join(dir, "go.sum"))
	if err != nil {
		return err
	}
	if !r.o.tidy { // -tidy keeps the tidied files, and serves them to the modules after
		if err := r.checkTidy(m, modBefore, modAfter, sumBefore, sumAfter); err != nil {
			return err
		}
	}
	if err := publish(r.proxy, module.Version{Path: m.Path, Version: r.version}, dir, r.when); err != nil {
		return fmt.Errorf("%s: %w", m.Dir, err)
	}
	logf("  %-22s tidy, zip, serve  %s", m.Dir, since(t))
	return nil
}

// checkTidy fails if tidy changed m's go.mod beyond the sibling versions or
// its go.sum beyond the siblings' lines: the committed module was not tidy.
func (r *release) checkTidy(m *mod, modBefore, modAfter, sumBefore, sumAfter []byte) error {
	dir := r.dir(m)
	var untidy []string
	if d := lineDiff(lines(modBefore), lines(modAfter)); d != "" {
		untidy = append(untidy, "go.mod (as committed, sibling versions set to "+r.version+"; - committed, + tidy):\n"+indent(d))
	}
	if d := lineDiff(foreignSumLines(sumBefore, r.ws.isSibling), foreignSumLines(sumAfter, r.ws.isSibling)); d != "" {
		untidy = append(untidy, "go.sum (lines of other modules than the siblings; - committed, + tidy):\n"+indent(d))
	}
	if len(untidy) > 0 {
		hint := "run with -keep to look at the tidied files"
		if r.o.keep {
			hint = "the tidied go.mod and go.sum are in " + dir
		}
		return fmt.Errorf("%s: the committed module is not tidy: `go mod tidy` (GOWORK=off, siblings at %s from the local proxy) changes\n%s\nRun `make tidy` (go mod tidy cannot run in the workspace while the siblings are unpublished), or %s", m.Dir, r.version, strings.Join(untidy, "\n"), hint)
	}
	return nil
}

func readOptional(name string) ([]byte, error) {
	data, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return data, err
}

// prepareDocs writes the release's CHANGELOG.md into the copy, and sets
// the install lines of every other Markdown file to the version.
func (r *release) prepareDocs() error {
	changes, err := r.cl.release(r.version, r.o.date)
	if err != nil {
		return err
	}
	root := r.ws.rootPath()
	return filepath.WalkDir(r.src, func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(r.src, name)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		var data, after []byte
		switch {
		case rel == "CHANGELOG.md":
			data, after = r.cl.data, changes
		case isInstallDoc(rel):
			if data, err = os.ReadFile(name); err != nil {
				return err
			}
			after = setInstallVersions(data, root, r.version)
		default:
			return nil
		}
		if bytes.Equal(data, after) {
			return nil
		}
		r.docs = append(r.docs, rel)
		return os.WriteFile(name, after, 0o644)
	})
}

// writeBack copies the changed go.mod, go.sum and go.work files, and the
// documents prepare changed, into the working tree and prints the commit
// and the tags to make.
func (r *release) writeBack() error {
	var names []string
	for _, m := range r.ws.Mods {
		names = append(names, path.Join(m.Dir, "go.mod"), path.Join(m.Dir, "go.sum"))
	}
	names = append(names, "go.work")
	names = append(names, r.docs...)
	var changed []string
	for _, name := range names {
		data, err := readOptional(filepath.Join(r.src, filepath.FromSlash(name)))
		if err != nil {
			return err
		}
		if data == nil {
			continue
		}
		dst := filepath.Join(r.repo, filepath.FromSlash(name))
		old, err := readOptional(dst)
		if err != nil {
			return err
		}
		if old != nil && bytes.Equal(old, data) {
			continue
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return err
		}
		changed = append(changed, name)
	}
	var b strings.Builder
	if len(changed) == 0 {
		fmt.Fprintf(&b, "\nNothing changed: HEAD is %s as it is. Tag it:\n\n", r.version)
	} else {
		fmt.Fprintf(&b, "\n%s is ready: %d files changed in the working tree. Review them (git diff), then commit and tag:\n\n", r.version, len(changed))
		fmt.Fprintf(&b, "  git add %s\n", strings.Join(changed, " "))
		fmt.Fprintf(&b, "  git commit -m 'Release %s'\n", r.version)
	}
	var tags []string
	for _, layer := range r.order {
		for _, m := range layer {
			tags = append(tags, tagName(m.Dir, r.version))
		}
	}
	for _, t := range tags {
		fmt.Fprintf(&b, "  git tag %s\n", t)
	}
	fmt.Fprintf(&b, "\nThen push the commit, and the tags in this order (dependencies first):\n\n  git push origin HEAD\n")
	for _, t := range tags {
		fmt.Fprintf(&b, "  git push origin %s\n", t)
	}
	fmt.Print(b.String())
	return nil
}
