package main

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

// mod is one module of the workspace.
type mod struct {
	Dir  string // slash-separated, relative to the repository root; "." for the root module
	Path string
	Data []byte // go.mod as read
	File *modfile.File
}

// workspace is the repository's modules, as go.work lists them.
type workspace struct {
	WorkData []byte
	Mods     []*mod // in go.work order
	byPath   map[string]*mod
}

// parseWorkspace reads go.work and, through readMod, every go.mod it uses.
func parseWorkspace(workData []byte, readMod func(dir string) ([]byte, error)) (*workspace, error) {
	wf, err := modfile.ParseWork("go.work", workData, nil)
	if err != nil {
		return nil, err
	}
	ws := &workspace{WorkData: workData, byPath: map[string]*mod{}}
	for _, u := range wf.Use {
		dir := path.Clean(strings.TrimPrefix(u.Path, "./"))
		name := path.Join(dir, "go.mod")
		data, err := readMod(dir)
		if err != nil {
			return nil, err
		}
		f, err := modfile.Parse(name, data, nil)
		if err != nil {
			return nil, err
		}
		if f.Module == nil {
			return nil, fmt.Errorf("%s: no module line", name)
		}
		m := &mod{Dir: dir, Path: f.Module.Mod.Path, Data: data, File: f}
		if ws.byPath[m.Path] != nil {
			return nil, fmt.Errorf("go.work uses %s twice (%s and %s)", m.Path, ws.byPath[m.Path].Dir, dir)
		}
		ws.byPath[m.Path] = m
		ws.Mods = append(ws.Mods, m)
	}
	if len(ws.Mods) == 0 {
		return nil, errors.New("go.work uses no module")
	}
	return ws, nil
}

func (ws *workspace) isSibling(path string) bool { return ws.byPath[path] != nil }

// siblings returns the sibling modules m requires, in go.mod order.
func (ws *workspace) siblings(m *mod) []*mod {
	var out []*mod
	for _, r := range m.File.Require {
		if s := ws.byPath[r.Mod.Path]; s != nil && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// problems lists what makes the modules unreleasable: replace
// directives, requires of a sibling at v0.0.0 or at a pseudo-version, and
// module paths that a tag of the form dir/vX.Y.Z cannot serve.
func (ws *workspace) problems() []string {
	var out []string
	root := ws.byPath[ws.rootPath()]
	for _, m := range ws.Mods {
		name := path.Join(m.Dir, "go.mod")
		for _, r := range m.File.Replace {
			out = append(out, fmt.Sprintf("%s:%d: replace %s", name, r.Syntax.Start.Line, r.Old.Path))
		}
		for _, r := range m.File.Require {
			if !ws.isSibling(r.Mod.Path) {
				continue
			}
			v := r.Mod.Version
			if v == "v0.0.0" || module.IsPseudoVersion(v) {
				out = append(out, fmt.Sprintf("%s:%d: require %s %s: a sibling must be required at a release version", name, r.Syntax.Start.Line, r.Mod.Path, v))
			}
		}
		if root == nil {
			continue
		}
		if want := path.Join(root.Path, m.Dir); m.Dir != "." && m.Path != want {
			out = append(out, fmt.Sprintf("%s: module %s: a tag %s would not serve it; its path must be %s", name, m.Path, tagName(m.Dir, "vX.Y.Z"), want))
		}
	}
	if root == nil {
		out = append(out, "go.work does not use the repository root (.)")
	}
	return out
}

func (ws *workspace) rootPath() string {
	for _, m := range ws.Mods {
		if m.Dir == "." {
			return m.Path
		}
	}
	return ""
}

// requiredVersions maps each version at which a sibling is required to
// where (go.mod file: module path).
func (ws *workspace) requiredVersions() map[string][]string {
	out := map[string][]string{}
	for _, m := range ws.Mods {
		for _, r := range m.File.Require {
			if ws.isSibling(r.Mod.Path) {
				out[r.Mod.Version] = append(out[r.Mod.Version], path.Join(m.Dir, "go.mod")+": "+r.Mod.Path)
			}
		}
	}
	return out
}

// tagName is the git tag of the module in dir at version v.
func tagName(dir, v string) string {
	if dir == "." || dir == "" {
		return v
	}
	return dir + "/" + v
}

// checkVersion accepts a canonical semantic version of major 0 or 1 (the
// module paths have no /vN suffix), without build metadata.
func checkVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Build(v) != "" {
		return fmt.Errorf("version %q: want a full semantic version such as v0.2.0", v)
	}
	if m := semver.Major(v); m != "v0" && m != "v1" {
		return fmt.Errorf("version %s: major %s needs /%s module paths", v, m, m)
	}
	return nil
}

// requiredVersion is the version every sibling require carries: the
// version -tidy serves this tree at.
func requiredVersion(ws *workspace) (string, error) {
	req := ws.requiredVersions()
	if len(req) == 0 {
		return "", errors.New("no module requires a sibling, so there is no version to serve them at")
	}
	if len(req) > 1 {
		var lines []string
		for _, v := range slices.Sorted(maps.Keys(req)) {
			lines = append(lines, fmt.Sprintf("  %s: %s", v, strings.Join(req[v], ", ")))
		}
		return "", fmt.Errorf("the siblings are required at different versions; they must agree:\n%s", strings.Join(lines, "\n"))
	}
	var v string
	for v = range req {
	}
	if err := checkVersion(v); err != nil {
		return "", fmt.Errorf("siblings are required at %s: %w", v, err)
	}
	return v, nil
}

// chooseVersion is the version a check or a release works at: explicit
// if given, else the one CHANGELOG.md names next. Either must be one
// CHANGELOG.md allows (changelog.checkRelease).
func chooseVersion(cl *changelog, explicit string) (v, why string, err error) {
	v, why = cl.next()
	if explicit != "" {
		if err := checkVersion(explicit); err != nil {
			return "", "", err
		}
		v, why = explicit, "given"
	}
	if err := cl.checkRelease(v); err != nil {
		return "", "", err
	}
	return v, why, nil
}

// layers orders the modules by their sibling requires: every module comes
// in a later layer than each sibling it requires. Within a layer, go.work
// order.
func (ws *workspace) layers() ([][]*mod, error) {
	done := map[*mod]bool{}
	var out [][]*mod
	for len(done) < len(ws.Mods) {
		var layer []*mod
		for _, m := range ws.Mods {
			if done[m] {
				continue
			}
			ready := true
			for _, s := range ws.siblings(m) {
				if s != m && !done[s] {
					ready = false
				}
			}
			if ready {
				layer = append(layer, m)
			}
		}
		if len(layer) == 0 {
			var left []string
			for _, m := range ws.Mods {
				if !done[m] {
					left = append(left, m.Path)
				}
			}
			return nil, fmt.Errorf("the sibling requires form a cycle among: %s", strings.Join(left, ", "))
		}
		for _, m := range layer {
			done[m] = true
		}
		out = append(out, layer)
	}
	return out, nil
}

// rewriteGoMod sets every require of a sibling to v, keeping the rest of
// the file (comments, // indirect, blocks) as it is.
func rewriteGoMod(name string, data []byte, isSibling func(string) bool, v string) ([]byte, error) {
	f, err := modfile.Parse(name, data, nil)
	if err != nil {
		return nil, err
	}
	changed := false
	for _, r := range f.Require {
		if isSibling(r.Mod.Path) && r.Mod.Version != v {
			if err := f.AddRequire(r.Mod.Path, v); err != nil {
				return nil, err
			}
			changed = true
		}
	}
	if !changed {
		return data, nil
	}
	f.Cleanup()
	return modfile.Format(f.Syntax), nil
}

// rewriteGoWork points the workspace's replace lines at version v: one
// "path v => ./dir" line for every module, updated in place where it
// exists.
func rewriteGoWork(data []byte, mods []*mod, v string) ([]byte, error) {
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, r := range wf.Replace {
		m := findMod(mods, r.Old.Path)
		if m == nil || r.Old.Version == "" {
			// Not ours, or a replace of every version: nothing to keep in step.
			have[r.Old.Path] = have[r.Old.Path] || m != nil
			continue
		}
		have[m.Path] = true
		if r.Old.Version == v {
			continue
		}
		tok := r.Syntax.Token
		i := slices.Index(tok, modfile.AutoQuote(r.Old.Path))
		if i < 0 || i+1 >= len(tok) || tok[i+1] != r.Old.Version {
			return nil, fmt.Errorf("go.work:%d: cannot find the version of %s in %q", r.Syntax.Start.Line, r.Old.Path, tok)
		}
		tok[i+1] = v
		r.Old.Version = v
	}
	// A missing line goes into the last replace block. (WorkFile.AddReplace
	// would add a line of its own after it.)
	var block *modfile.LineBlock
	for _, stmt := range wf.Syntax.Stmt {
		if b, ok := stmt.(*modfile.LineBlock); ok && len(b.Token) > 0 && b.Token[0] == "replace" {
			block = b
		}
	}
	for _, m := range mods {
		if have[m.Path] {
			continue
		}
		dir := "./" + strings.TrimPrefix(m.Dir, ".")
		if block != nil {
			block.Line = append(block.Line, &modfile.Line{Token: []string{modfile.AutoQuote(m.Path), v, "=>", dir}, InBlock: true})
		} else if err := wf.AddReplace(m.Path, v, dir, ""); err != nil {
			return nil, err
		}
	}
	wf.Cleanup()
	out := modfile.Format(wf.Syntax)
	if string(out) == string(data) {
		return data, nil
	}
	return out, nil
}

func findMod(mods []*mod, path string) *mod {
	for _, m := range mods {
		if m.Path == path {
			return m
		}
	}
	return nil
}

// foreignSumLines returns go.sum's lines that are not of a sibling.
func foreignSumLines(data []byte, isSibling func(string) bool) []string {
	var out []string
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || isSibling(f[0]) {
			continue
		}
		out = append(out, line)
	}
	return out
}
