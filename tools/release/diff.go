package main

import (
	"fmt"
	"strings"
)

// lineDiff shows how b differs from a, line by line: "-" for a line only
// in a, "+" for one only in b, with two lines of context and "@@ line N"
// at each hunk. It returns "" when they are equal.
func lineDiff(a, b []string) string {
	// Longest common subsequence, from the ends: fine for go.mod sizes.
	n, m := len(a), len(b)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type edit struct {
		op   byte // ' ', '-', '+'
		line string
		at   int // line number in a (1-based) of this or the next a line
	}
	var edits []edit
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			edits = append(edits, edit{' ', a[i], i + 1})
			i++
			j++
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			edits = append(edits, edit{'+', b[j], i + 1})
			j++
		default:
			edits = append(edits, edit{'-', a[i], i + 1})
			i++
		}
	}
	const context = 2
	show := make([]bool, len(edits))
	changed := false
	for k, e := range edits {
		if e.op == ' ' {
			continue
		}
		changed = true
		for c := max(0, k-context); c <= min(len(edits)-1, k+context); c++ {
			show[c] = true
		}
	}
	if !changed {
		return ""
	}
	var sb strings.Builder
	for k, e := range edits {
		if !show[k] {
			continue
		}
		if k == 0 || !show[k-1] {
			fmt.Fprintf(&sb, "@@ line %d\n", e.at)
		}
		fmt.Fprintf(&sb, "%c %s\n", e.op, e.line)
	}
	return sb.String()
}

func lines(data []byte) []string {
	s := strings.TrimSuffix(string(data), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
