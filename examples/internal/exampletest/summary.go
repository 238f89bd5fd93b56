package exampletest

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// An example ends its output with its summary and its verdict:
//
//	Summary:
//	  messages on the orders stream: 43 = 22 first copies of 22 orders + 20 second copies + 1 without an order id
//	  deliveries by outcome (/metrics): 49 = 22 processed + 24 duplicate + 1 in_progress + 1 handler_failed + 1 key_error
//	Check: 22 orders charged exactly once each ...
//
// Each line of the summary is a sum: a label, a colon, a total, "=", and
// the parts the total is made of, joined by " + ". The total and each
// part start with their number; what follows it says what it counts.

// Line is one line of an example's summary: a sum.
type Line struct {
	// Label is what the line is about: the text before its colon.
	Label string
	// Total is the number left of "=", and TotalOf what follows it.
	Total   int
	TotalOf string
	// Parts are the terms right of "=".
	Parts []Part
	// Line is the line as printed.
	Line string
}

// Part is one term of a [Line].
type Part struct {
	N  int
	Of string
}

// Summary is an example's summary, its lines in order.
type Summary []Line

var (
	sumLine = regexp.MustCompile(`^  (\S[^:]*): (\d+)( [^=]*)? = (.+)$`)
	term    = regexp.MustCompile(`^(\d+)(?: (.*))?$`)
)

// ParseSummary returns the summary that ends out, before its verdict
// line. It returns an error if out does not end with a summary and a
// verdict starting with check, if a line of the summary is not a sum, or
// if a sum does not add up.
func ParseSummary(out, check string) (Summary, error) {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	start := -1
	for i := len(lines) - 1; i >= 0; i-- {
		if lines[i] == "Summary:" {
			start = i
			break
		}
	}
	if start < 0 || start+2 >= len(lines) {
		return nil, fmt.Errorf("the output does not end with a summary (a line %q, its sums) and %q:\n%s", "Summary:", check, out)
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, check) {
		return nil, fmt.Errorf("the output's last line is not %q...: %q", check, last)
	}
	var s Summary
	for _, line := range lines[start+1 : len(lines)-1] {
		sum, err := parseSum(line)
		if err != nil {
			return nil, err
		}
		s = append(s, sum)
	}
	return s, nil
}

func parseSum(line string) (Line, error) {
	m := sumLine.FindStringSubmatch(line)
	if m == nil {
		return Line{}, fmt.Errorf("summary line %q is not \"  label: total = part + part ...\"", line)
	}
	sum := Line{Label: m[1], TotalOf: strings.TrimSpace(m[3]), Line: line}
	sum.Total, _ = strconv.Atoi(m[2])
	added := 0
	for _, t := range strings.Split(m[4], " + ") {
		tm := term.FindStringSubmatch(t)
		if tm == nil {
			return Line{}, fmt.Errorf("summary line %q: term %q does not start with its number", line, t)
		}
		n, _ := strconv.Atoi(tm[1])
		sum.Parts = append(sum.Parts, Part{N: n, Of: tm[2]})
		added += n
	}
	if added != sum.Total {
		return Line{}, fmt.Errorf("summary line %q does not add up: its parts make %d, not %d", line, added, sum.Total)
	}
	return sum, nil
}

// Get returns the sum labelled label, or else the one whose label starts
// with label. It returns an error if there is none, or more than one.
func (s Summary) Get(label string) (Line, error) {
	var found []Line
	for _, sum := range s {
		if sum.Label == label {
			return sum, nil
		}
		if strings.HasPrefix(sum.Label, label) {
			found = append(found, sum)
		}
	}
	if len(found) != 1 {
		return Line{}, fmt.Errorf("%d summary lines labelled %q..., want 1", len(found), label)
	}
	return found[0], nil
}

// Part returns the number of the part whose text starts with of, and
// whether there is one.
func (s Line) Part(of string) (int, bool) {
	for _, p := range s.Parts {
		if strings.HasPrefix(p.Of, of) {
			return p.N, true
		}
	}
	return 0, false
}

// Expect collects the differences between a summary and what a test saw.
type Expect struct {
	Summary Summary
	errs    []string
}

// Total records an error unless the total of the line labelled label is
// want.
func (e *Expect) Total(label string, want int) {
	sum, err := e.Summary.Get(label)
	if err != nil {
		e.errs = append(e.errs, err.Error())
		return
	}
	if sum.Total != want {
		e.errs = append(e.errs, fmt.Sprintf("%q: the total is %d; the test saw %d", sum.Line, sum.Total, want))
	}
}

// Part records an error unless the line labelled label has a part
// starting with of, of want.
func (e *Expect) Part(label, of string, want int) {
	sum, err := e.Summary.Get(label)
	if err != nil {
		e.errs = append(e.errs, err.Error())
		return
	}
	n, ok := sum.Part(of)
	switch {
	case !ok:
		e.errs = append(e.errs, fmt.Sprintf("%q has no part %q", sum.Line, of))
	case n != want:
		e.errs = append(e.errs, fmt.Sprintf("%q: %q is %d; the test saw %d", sum.Line, of, n, want))
	}
}

// Value returns the number of the part of, in the line labelled label,
// and records an error if there is none.
func (e *Expect) Value(label, of string) int {
	sum, err := e.Summary.Get(label)
	if err != nil {
		e.errs = append(e.errs, err.Error())
		return 0
	}
	n, ok := sum.Part(of)
	if !ok {
		e.errs = append(e.errs, fmt.Sprintf("%q has no part %q", sum.Line, of))
	}
	return n
}

// That records msg, formatted, unless ok.
func (e *Expect) That(ok bool, format string, args ...any) {
	if !ok {
		e.errs = append(e.errs, fmt.Sprintf(format, args...))
	}
}

// Err returns every difference recorded, or nil.
func (e *Expect) Err() error {
	if len(e.errs) == 0 {
		return nil
	}
	return fmt.Errorf("the summary and what the test saw differ:\n  %s", strings.Join(e.errs, "\n  "))
}
