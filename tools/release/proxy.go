package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// proxyDir is where a GOPROXY=file://root proxy keeps a module's files:
// root/<escaped path>/@v.
func proxyDir(root, path string) (string, error) {
	ep, err := module.EscapePath(path)
	if err != nil {
		return "", err
	}
	return filepath.Join(root, filepath.FromSlash(ep), "@v"), nil
}

// proxyFile is the file of module path at version v with extension ext
// (".zip", ".mod", ".info") in a file proxy.
func proxyFile(root, path, v, ext string) (string, error) {
	dir, err := proxyDir(root, path)
	if err != nil {
		return "", err
	}
	ev, err := module.EscapeVersion(v)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, ev+ext), nil
}

// publish puts module mv, whose files are in dir, into the file proxy at
// root: its zip, its go.mod, its .info (with time t) and its line in list.
func publish(root string, mv module.Version, dir string, t time.Time) error {
	zipName, err := proxyFile(root, mv.Path, mv.Version, ".zip")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(zipName), 0o755); err != nil {
		return err
	}
	zf, err := os.Create(zipName)
	if err != nil {
		return err
	}
	if err := zip.CreateFromDir(zf, mv, dir); err != nil {
		zf.Close()
		return fmt.Errorf("zip of %s: %w", mv, err)
	}
	if err := zf.Close(); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(strings.TrimSuffix(zipName, ".zip")+".mod", gomod, 0o644); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{mv.Version, t.UTC()})
	if err != nil {
		return err
	}
	if err := os.WriteFile(strings.TrimSuffix(zipName, ".zip")+".info", info, 0o644); err != nil {
		return err
	}
	return addToList(filepath.Join(filepath.Dir(zipName), "list"), mv.Version)
}

// addToList adds version v to a proxy's list file, once.
func addToList(name, v string) error {
	data, err := os.ReadFile(name)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	versions := strings.Fields(string(data))
	if slices.Contains(versions, v) {
		return nil
	}
	versions = append(versions, v)
	return os.WriteFile(name, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}
