package monitoring_test

import (
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// The pack against a real Prometheus scraping a real service: a router
// with the middleware on a Postgres store and outbox, driven through every
// outcome the pack watches. Every query of the dashboard (its variables
// set to All, then to the values their own queries find), every alert's
// expression and every PromQL snippet of docs/operations.md must return
// data, so that a misspelt metric, label or label value fails here; every
// rule must evaluate without error, and the alerts the run brings about
// must be pending or firing.
func TestPackOnARealPrometheus(t *testing.T) {
	s := startService(t)
	u, err := url.Parse(s.metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	p := startPrometheus(t, u.Host, "alerts.yaml")
	waitFor(t, "Prometheus to scrape the service", time.Minute, func() []string {
		if p.up() {
			return nil
		}
		return []string{"the target is not up"}
	})
	// The series each handler starts at zero must be scraped at zero
	// before the outcomes happen, for increase() to see them.
	time.Sleep(2 * time.Second)
	s.drive(p)

	d := loadDashboard(t)
	rules := loadRules(t)
	snippets := promqlSnippets(t, "../docs/operations.md")
	if len(snippets) == 0 {
		t.Error("docs/operations.md has no promql snippet")
	}
	waitFor(t, "every query to return data", 3*time.Minute, func() []string {
		var fails []string
		fails = append(fails, checkDashboard(p, d)...)
		fails = append(fails, checkAlerts(p, rules)...)
		for _, q := range snippets {
			if res, err := p.query(q); err != nil || len(res) == 0 {
				fails = append(fails, fmt.Sprintf("docs/operations.md: %s: %s", q, noData(err)))
			}
		}
		return fails
	})
}

// waitFor calls check until it reports nothing wrong, and fails the test
// with its last report after timeout.
func waitFor(t *testing.T, what string, timeout time.Duration, check func() []string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		fails := check()
		if len(fails) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s:\n  %s", timeout, what, strings.Join(fails, "\n  "))
		}
		time.Sleep(time.Second)
	}
}

func noData(err error) string {
	if err != nil {
		return err.Error()
	}
	return "no data"
}

// grafanaRanges are the values Grafana gives its range variables here.
var grafanaRanges = map[string]string{"__rate_interval": "1m", "__interval": "15s", "__range": "15m"}

var varRef = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)|\[\[(\w+)\]\]`)

// substitute replaces the variables in expr with their values, and
// reports a variable that has none.
func substitute(expr string, values map[string]string) (string, error) {
	var missing []string
	out := varRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := varRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		if v, ok := values[name]; ok {
			return v
		}
		if v, ok := grafanaRanges[name]; ok {
			return v
		}
		missing = append(missing, name)
		return ref
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("unknown variables %v", missing)
	}
	return out, nil
}

var labelValuesQuery = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// checkDashboard runs every query of the dashboard twice: with each
// variable set to All, and with each set to every value its query finds
// (with the variables before it set so), as Grafana sends a multi-value
// selection.
func checkDashboard(p *promServer, d dashboard) []string {
	var fails []string
	all, selected := map[string]string{}, map[string]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		all[v.Name] = v.AllValue
		q, _ := v.Query.(string)
		m := labelValuesQuery.FindStringSubmatch(q)
		if m == nil {
			fails = append(fails, fmt.Sprintf("variable %s: %q is not label_values(selector, label)", v.Name, q))
			continue
		}
		match, err := substitute(m[1], selected)
		if err != nil {
			fails = append(fails, fmt.Sprintf("variable %s: %v", v.Name, err))
			continue
		}
		values, err := p.labelValues(m[2], match)
		if err != nil || len(values) == 0 {
			fails = append(fails, fmt.Sprintf("variable %s: %s: %s", v.Name, q, noData(err)))
			continue
		}
		quoted := make([]string, len(values))
		for i, val := range values {
			// As Grafana formats a multi-value selection for Prometheus:
			// a regular expression, in a PromQL string.
			quoted[i] = strings.ReplaceAll(regexp.QuoteMeta(val), `\`, `\\`)
		}
		selected[v.Name] = "(" + strings.Join(quoted, "|") + ")"
	}
	for _, v := range d.Templating.List {
		if v.Type == "datasource" {
			all[v.Name], selected[v.Name] = "", ""
		}
	}
	for _, pn := range d.Panels {
		for _, tg := range pn.Targets {
			for _, values := range []map[string]string{all, selected} {
				expr, err := substitute(tg.Expr, values)
				if err == nil {
					var res []sample
					if res, err = p.query(expr); err == nil && len(res) == 0 {
						err = fmt.Errorf("no data")
					}
				}
				if err != nil {
					fails = append(fails, fmt.Sprintf("panel %q: %s: %v", pn.Title, expr, err))
				}
			}
		}
	}
	return fails
}

// needsTime are the alerts a test run cannot bring about, and why; their
// expressions are checked without their threshold.
var needsTime = map[string]string{
	"IdempotencyStoreSlow":  "renewals slower than half a second",
	"IdempotencyLeaseStuck": "a lease held for fifteen minutes",
}

var threshold = regexp.MustCompile(`(?s)^(.*\S)\s*>\s*[0-9.]+\s*$`)

// checkAlerts queries each alert's expression, and its left-hand side
// without the threshold, and looks at the rules as Prometheus evaluates
// them.
func checkAlerts(p *promServer, rules []alertRule) []string {
	var fails []string
	loaded, err := p.rules()
	if err != nil {
		return []string{"rules: " + err.Error()}
	}
	for _, r := range rules {
		m := threshold.FindStringSubmatch(r.Expr)
		if m == nil {
			fails = append(fails, fmt.Sprintf("alert %s: the expression does not end in > threshold: %s", r.Alert, r.Expr))
			continue
		}
		if res, err := p.query(m[1]); err != nil || len(res) == 0 {
			fails = append(fails, fmt.Sprintf("alert %s, without its threshold: %s: %s", r.Alert, m[1], noData(err)))
		}
		l, ok := loaded[r.Alert]
		switch {
		case !ok:
			fails = append(fails, fmt.Sprintf("alert %s: not loaded by Prometheus", r.Alert))
		case l.Health != "ok":
			fails = append(fails, fmt.Sprintf("alert %s: health %q: %s", r.Alert, l.Health, l.LastError))
		}
		if _, later := needsTime[r.Alert]; later {
			continue
		}
		if res, err := p.query(r.Expr); err != nil || len(res) == 0 {
			fails = append(fails, fmt.Sprintf("alert %s: %s: %s", r.Alert, strings.TrimSpace(r.Expr), noData(err)))
		}
		if ok && l.State != "pending" && l.State != "firing" {
			fails = append(fails, fmt.Sprintf("alert %s: %s, want pending or firing", r.Alert, l.State))
		}
	}
	return fails
}

// promqlSnippets returns the ```promql blocks of a Markdown file, one
// expression each.
func promqlSnippets(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	var cur []string
	in := false
	for line := range strings.SplitSeq(string(b), "\n") {
		switch {
		case !in && strings.TrimSpace(line) == "```promql":
			in, cur = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			out = append(out, strings.Join(cur, "\n"))
		case in:
			cur = append(cur, line)
		}
	}
	return out
}

// TestNeedsTimeNamesAlerts keeps needsTime in step with alerts.yaml.
func TestNeedsTimeNamesAlerts(t *testing.T) {
	var names []string
	for _, r := range loadRules(t) {
		names = append(names, r.Alert)
	}
	sort.Strings(names)
	for name := range needsTime {
		if !slices.Contains(names, name) {
			t.Errorf("needsTime names %s, which alerts.yaml does not have", name)
		}
	}
}
