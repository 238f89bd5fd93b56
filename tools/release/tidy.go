package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/semver"
)

// copyWorkingTree copies the working tree's files that git tracks or would
// track (untracked ones not ignored) into dst: what -tidy tidies.
func copyWorkingTree(ctx context.Context, repo, dst string) error {
	out, err := exec.CommandContext(ctx, "git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		return fmt.Errorf("git ls-files: %w", err)
	}
	for name := range strings.SplitSeq(strings.TrimRight(string(out), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		src := filepath.Join(repo, filepath.FromSlash(name))
		st, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			continue
		}
		to := filepath.Join(dst, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		if err := copyFile(src, to, st.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// tidySum is the go.sum a tidy writes back to the working tree: the tidied
// lines of other modules, with the siblings' lines as they were (the
// tidy's are of this tree served at the version, not of a release), in the
// go command's order.
func tidySum(before, tidied []byte, isSibling func(string) bool) []byte {
	var keep []string
	for line := range strings.SplitSeq(string(before), "\n") {
		if f := strings.Fields(line); len(f) > 0 && isSibling(f[0]) {
			keep = append(keep, line)
		}
	}
	all := append(foreignSumLines(tidied, isSibling), keep...)
	slices.SortFunc(all, compareSumLines)
	all = slices.Compact(all)
	if len(all) == 0 {
		return nil
	}
	return []byte(strings.Join(all, "\n") + "\n")
}

// compareSumLines orders go.sum lines as the go command does: by module
// path, then by version, a version's zip before its go.mod.
func compareSumLines(a, b string) int {
	fa, fb := strings.Fields(a), strings.Fields(b)
	if len(fa) < 2 || len(fb) < 2 {
		return strings.Compare(a, b)
	}
	if c := strings.Compare(fa[0], fb[0]); c != 0 {
		return c
	}
	va, modA := strings.CutSuffix(fa[1], "/go.mod")
	vb, modB := strings.CutSuffix(fb[1], "/go.mod")
	if c := semver.Compare(va, vb); c != 0 {
		return c
	}
	if c := strings.Compare(va, vb); c != 0 {
		return c
	}
	switch {
	case modA == modB:
		return strings.Compare(a, b)
	case modB:
		return -1
	}
	return 1
}

// writeTidied writes every module's tidied go.mod and go.sum from the copy
// back into the working tree, and says which changed.
func (r *release) writeTidied() error {
	var changed []string
	for _, m := range r.ws.Mods {
		for _, name := range []string{"go.mod", "go.sum"} {
			rel := path.Join(m.Dir, name)
			tidied, err := readOptional(filepath.Join(r.src, filepath.FromSlash(rel)))
			if err != nil {
				return err
			}
			dst := filepath.Join(r.repo, filepath.FromSlash(rel))
			before, err := readOptional(dst)
			if err != nil {
				return err
			}
			if name == "go.sum" {
				tidied = tidySum(before, tidied, r.ws.isSibling)
			}
			if bytes.Equal(before, tidied) {
				continue
			}
			if tidied == nil {
				err = os.Remove(dst)
			} else {
				err = os.WriteFile(dst, tidied, 0o644)
			}
			if err != nil {
				return err
			}
			changed = append(changed, rel)
		}
	}
	if len(changed) == 0 {
		logf("every module is tidy")
		return nil
	}
	logf("tidied: %s", strings.Join(changed, " "))
	return nil
}
