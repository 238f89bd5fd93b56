package main

import (
	"archive/zip"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The proxy holds a module the way GOPROXY=file:// reads it: escaped
// path (capitals as !lower), @v/<version>.zip, .mod, .info and list.
func TestPublishLayout(t *testing.T) {
	src, proxy := t.TempDir(), t.TempDir()
	const path = "example.com/Big/mod"
	writeFiles(t, src, map[string]string{
		"go.mod":         "module " + path + "\n\ngo 1.26.0\n",
		"a.go":           "package mod\n",
		"sub/go.mod":     "module " + path + "/sub\n",
		"sub/b.go":       "package sub\n",
		"inner/c.go":     "package inner\n",
		"vendor/x/x.go":  "package x\n",
		"docs/readme.md": "hello\n",
	})
	when := time.Date(2026, 11, 3, 10, 0, 0, 0, time.UTC)
	for _, v := range []string{"v0.1.0", "v0.2.0", "v0.1.0"} {
		if err := publish(proxy, module.Version{Path: path, Version: v}, src, when); err != nil {
			t.Fatal(err)
		}
	}
	at := filepath.Join(proxy, "example.com", "!big", "mod", "@v")
	list, err := os.ReadFile(filepath.Join(at, "list"))
	if err != nil {
		t.Fatal(err)
	}
	if string(list) != "v0.1.0\nv0.2.0\n" {
		t.Errorf("list %q, want each version once", list)
	}
	mod, err := os.ReadFile(filepath.Join(at, "v0.2.0.mod"))
	if err != nil || !strings.HasPrefix(string(mod), "module "+path+"\n") {
		t.Errorf("v0.2.0.mod: %q, %v", mod, err)
	}
	var info struct {
		Version string
		Time    time.Time
	}
	data, err := os.ReadFile(filepath.Join(at, "v0.2.0.info"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &info); err != nil || info.Version != "v0.2.0" || !info.Time.Equal(when) {
		t.Errorf("v0.2.0.info: %s (%v)", data, err)
	}
	zr, err := zip.OpenReader(filepath.Join(at, "v0.2.0.zip"))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	prefix := path + "@v0.2.0/"
	want := []string{prefix + "a.go", prefix + "docs/readme.md", prefix + "go.mod", prefix + "inner/c.go"}
	if !slices.Equal(names, want) {
		t.Errorf("zip holds %q, want %q (no nested module, no vendor)", names, want)
	}
}

// The go command itself downloads from the proxy: the layout is what
// GOPROXY=file:// expects.
func TestProxyServesTheGoCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	src, proxy, cache := t.TempDir(), t.TempDir(), t.TempDir()
	const path = "example.com/Big/mod"
	writeFiles(t, src, map[string]string{"go.mod": "module " + path + "\n\ngo 1.26.0\n", "a.go": "package mod\n"})
	if err := publish(proxy, module.Version{Path: path, Version: "v0.3.0"}, src, time.Now()); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goBin(), "mod", "download", "-json", path+"@v0.3.0")
	cmd.Dir = t.TempDir()
	env := withEnv(os.Environ(), map[string]string{
		"GOPROXY": "file://" + filepath.ToSlash(proxy), "GOMODCACHE": cache, "GOFLAGS": "-modcacherw",
		"GONOSUMDB": "example.com", "GOWORK": "off", "GOTOOLCHAIN": "local", "GO111MODULE": "on",
	})
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go mod download: %v\n%s", err, out)
	}
	var got struct{ Version, Dir string }
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got.Version != "v0.3.0" {
		t.Errorf("downloaded %q", got.Version)
	}
	if _, err := os.Stat(filepath.Join(got.Dir, "a.go")); err != nil {
		t.Error(err)
	}
	// A version list query reads list.
	cmd = exec.Command(goBin(), "list", "-m", "-versions", path)
	cmd.Dir, cmd.Env = t.TempDir(), env
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != path+" v0.3.0" {
		t.Errorf("go list -m -versions: %q, %v", out, err)
	}
}
