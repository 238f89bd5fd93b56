package main

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/mod/semver"
)

// The version of a release comes from CHANGELOG.md, not from git tags: a
// clone may have none, and a tag says nothing of what changed since.
// CHANGELOG.md is in Keep a Changelog form: an [Unreleased] section, then
// one section per release, newest first, "## [0.1.0] - 2026-11-25", each
// with "### Added", "### Changed", ... headings over "- " entries.

// changelog is what the release tool reads in CHANGELOG.md.
type changelog struct {
	data []byte
	// released is the newest release's version, v0.1.0, and its date;
	// empty when there is none.
	released, date string
	// kinds are the headings of [Unreleased] with at least one entry, in
	// order: Added, Changed, ...
	kinds []string
	// unreleasedStart and unreleasedEnd delimit the body of [Unreleased]:
	// from the end of its heading's line to the next section's heading.
	unreleasedStart, unreleasedEnd int
}

var (
	unreleasedHeading = regexp.MustCompile(`(?m)^## \[Unreleased\][ \t]*\n`)
	releaseHeading    = regexp.MustCompile(`(?m)^## \[([0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?)\] - ([0-9]{4}-[0-9]{2}-[0-9]{2})[ \t]*$`)
	sectionHeading    = regexp.MustCompile(`(?m)^## `)
	kindHeading       = regexp.MustCompile(`^### (\S.*?)\s*$`)
)

// parseChangelog reads CHANGELOG.md.
func parseChangelog(data []byte) (*changelog, error) {
	c := &changelog{data: data}
	loc := unreleasedHeading.FindIndex(data)
	if loc == nil {
		return nil, errors.New("CHANGELOG.md: no \"## [Unreleased]\" section")
	}
	c.unreleasedStart, c.unreleasedEnd = loc[1], len(data)
	if next := sectionHeading.FindIndex(data[loc[1]:]); next != nil {
		c.unreleasedEnd = loc[1] + next[0]
	}
	if m := releaseHeading.FindSubmatch(data[c.unreleasedEnd:]); m != nil {
		c.released, c.date = "v"+string(m[1]), string(m[2])
	} else if c.unreleasedEnd < len(data) {
		line, _, _ := strings.Cut(string(data[c.unreleasedEnd:]), "\n")
		return nil, fmt.Errorf("CHANGELOG.md: the section after [Unreleased] is %q, not \"## [X.Y.Z] - YYYY-MM-DD\"", line)
	}
	kind := ""
	for line := range strings.SplitSeq(string(data[c.unreleasedStart:c.unreleasedEnd]), "\n") {
		if m := kindHeading.FindStringSubmatch(line); m != nil {
			kind = m[1]
			continue
		}
		if (strings.HasPrefix(line, "- ") || strings.HasPrefix(line, "* ")) && kind != "" && !slices.Contains(c.kinds, kind) {
			c.kinds = append(c.kinds, kind)
		}
	}
	return c, nil
}

// next is the version of the next release, and why: the newest release's
// when [Unreleased] has no entry (CHANGELOG.md names the release HEAD
// is), else the version after it by what [Unreleased] holds, as semver
// says. From 1.0: Removed or Changed, the next major (a Changed entry is
// taken as breaking: a release of compatible changes only is given its
// version); Added or Deprecated, the next minor; Fixed or Security only,
// the next patch. Before 1.0 the minor version stands for the major:
// Removed, Changed, Added or Deprecated, the next minor; Fixed or
// Security only, the next patch. A heading of another name counts as
// Changed. With no release yet, v0.1.0.
func (c *changelog) next() (v, why string) {
	if len(c.kinds) == 0 {
		if c.released == "" {
			return "v0.1.0", "CHANGELOG.md has no release and nothing under [Unreleased]"
		}
		return c.released, fmt.Sprintf("the newest release in CHANGELOG.md (%s), [Unreleased] being empty", c.date)
	}
	if c.released == "" {
		return "v0.1.0", "the first release in CHANGELOG.md"
	}
	var major, minor, patch int
	fmt.Sscanf(semver.Canonical(c.released), "v%d.%d.%d", &major, &minor, &patch)
	breaking, feature := false, false
	for _, k := range c.kinds {
		switch k {
		case "Fixed", "Security":
		case "Added", "Deprecated":
			feature = true
		default: // Changed, Removed, any other
			breaking = true
		}
	}
	kinds := strings.Join(c.kinds, ", ")
	switch {
	case breaking && major > 0:
		v = fmt.Sprintf("v%d.0.0", major+1)
		why = "a Changed or Removed entry, from 1.0 on: the next major"
	case breaking || feature:
		v = fmt.Sprintf("v%d.%d.0", major, minor+1)
		why = "the next minor"
		if breaking {
			why = "a Changed or Removed entry, before 1.0: the next minor"
		}
	default:
		v = fmt.Sprintf("v%d.%d.%d", major, minor, patch+1)
		why = "fixes only: the next patch"
	}
	return v, fmt.Sprintf("after %s (CHANGELOG.md, %s), [Unreleased] has %s entries; %s", c.released, c.date, kinds, why)
}

// checkRelease says whether v may be released: not below what next
// says, nor at or below the newest release unless CHANGELOG.md names v
// already with nothing unreleased.
func (c *changelog) checkRelease(v string) error {
	next, why := c.next()
	switch {
	case len(c.kinds) == 0 && v == c.released:
		return nil
	case len(c.kinds) == 0:
		return fmt.Errorf("CHANGELOG.md has no entry under [Unreleased] and names %s as the newest release: nothing to release as %s", c.released, v)
	case c.released != "" && semver.Compare(v, c.released) <= 0:
		return fmt.Errorf("%s is not after %s, the newest release in CHANGELOG.md", v, c.released)
	case semver.Compare(v, next) < 0:
		return fmt.Errorf("%s is below %s, the version semver gives: %s", v, next, why)
	}
	return nil
}

// release returns CHANGELOG.md with the entries of [Unreleased] moved to a
// section of their own, "## [X.Y.Z] - date", under an empty
// [Unreleased]; unchanged when the newest release is v already, and
// [Unreleased] empty.
func (c *changelog) release(v, date string) ([]byte, error) {
	if err := c.checkRelease(v); err != nil {
		return nil, err
	}
	if len(c.kinds) == 0 {
		return c.data, nil
	}
	body := strings.Trim(string(c.data[c.unreleasedStart:c.unreleasedEnd]), "\n")
	var b strings.Builder
	b.Write(c.data[:c.unreleasedStart])
	fmt.Fprintf(&b, "\n## [%s] - %s\n\n%s\n\n", strings.TrimPrefix(v, "v"), date, body)
	b.Write(c.data[c.unreleasedEnd:])
	return []byte(b.String()), nil
}

// installVersion finds, in a document, the versions of the install lines
// of the modules under root: "go get root/...@vX.Y.Z", "go install
// root/cmd/idem@vX.Y.Z".
func installVersion(root string) *regexp.Regexp {
	return regexp.MustCompile(regexp.QuoteMeta(root) + `((?:/[A-Za-z0-9._-]+)*)@(v[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?)\b`)
}

// setInstallVersions returns doc with every install line of a module
// under root naming version v.
func setInstallVersions(doc []byte, root, v string) []byte {
	re := installVersion(root)
	return re.ReplaceAllFunc(doc, func(m []byte) []byte {
		sub := re.FindSubmatch(m)
		return []byte(root + string(sub[1]) + "@" + v)
	})
}

// installLines lists the install lines of doc that name another version
// than v, each as "line N: module@version".
func installLines(doc []byte, root, v string) []string {
	var out []string
	re := installVersion(root)
	for i, line := range strings.Split(string(doc), "\n") {
		for _, m := range re.FindAllStringSubmatch(line, -1) {
			if m[2] != v {
				out = append(out, fmt.Sprintf("line %d: %s", i+1, m[0]))
			}
		}
	}
	return out
}

// isInstallDoc reports whether the install lines of the document at name
// (slash-separated, from the repository root) follow the release: every
// Markdown file but CHANGELOG.md, whose sections keep the versions they
// were written for.
func isInstallDoc(name string) bool {
	return strings.HasSuffix(name, ".md") && name != "CHANGELOG.md"
}
