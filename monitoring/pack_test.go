package monitoring_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/watermill-idempotency/idempotency/monitoring"
)

// dashboard is what the tests read of dashboard.json.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type variable struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Query      any            `json:"query"`
	Datasource map[string]any `json:"datasource"`
	AllValue   string         `json:"allValue"`
	IncludeAll bool           `json:"includeAll"`
}

type panel struct {
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource map[string]any `json:"datasource"`
	Targets    []struct {
		Expr       string         `json:"expr"`
		Datasource map[string]any `json:"datasource"`
	} `json:"targets"`
}

func loadDashboard(t testing.TB) dashboard {
	t.Helper()
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(monitoring.Dashboard))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	return d
}

// alertRule is what the tests read of a rule of alerts.yaml.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t testing.TB) []alertRule {
	t.Helper()
	var f struct {
		Groups []struct {
			Name  string      `yaml:"name"`
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(monitoring.AlertRules, &f); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	var out []alertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatal("alerts.yaml has no rule")
	}
	return out
}

// promtool runs promtool in this directory and fails the test with its
// output if it fails.
func promtool(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin(t, "promtool"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// promtool accepts the rules: their syntax, their PromQL, their templates.
func TestRulesCheck(t *testing.T) {
	t.Log(promtool(t, "check", "rules", "alerts.yaml"))
}

// promtool's unit tests of the rules pass: each alert fires on the
// series of alerts_test.yaml that should make it fire, and stays quiet on
// those that should not.
func TestRulesUnitTests(t *testing.T) {
	t.Log(promtool(t, "test", "rules", "alerts_test.yaml"))
}

// Every alert has a case where it fires and one where it stays quiet in
// alerts_test.yaml.
func TestEveryAlertHasAFiringAndAQuietCase(t *testing.T) {
	b, err := os.ReadFile("alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	firing, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, r := range loadRules(t) {
		if !firing[r.Alert] {
			t.Errorf("%s: no case of alerts_test.yaml where it fires", r.Alert)
		}
		if !quiet[r.Alert] {
			t.Errorf("%s: no case of alerts_test.yaml where it stays quiet", r.Alert)
		}
	}
}

// runbookURL is where every alert's runbook is: a section of
// docs/operations.md named after the alert.
const runbookURL = "https://github.com/watermill-idempotency/idempotency/blob/main/docs/operations.md#"

// Every alert has a severity, a summary, a description and a runbook
// link to a section of docs/operations.md named after it.
func TestEveryAlertHasARunbook(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := markdownAnchors(string(doc))
	for _, r := range loadRules(t) {
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if r.Annotations[a] == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		if want := runbookURL + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
		}
		if !anchors[strings.ToLower(r.Alert)] {
			t.Errorf("%s: docs/operations.md has no section %q for its runbook", r.Alert, "#### "+r.Alert)
		}
	}
}

// markdownAnchors returns the anchors GitHub gives the headings of doc.
func markdownAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	drop := regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
	inCode := false
	for line := range strings.SplitSeq(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		h = strings.ToLower(drop.ReplaceAllString(h, ""))
		out[strings.ReplaceAll(h, " ", "-")] = true
	}
	return out
}

// The dashboard takes its data source from a variable, so that it
// imports into any Grafana, and every query goes through it.
func TestDashboardUsesTheDataSourceVariable(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Error("the dashboard needs a uid and a title")
	}
	i := slices.IndexFunc(d.Templating.List, func(v variable) bool { return v.Type == "datasource" })
	if i < 0 || d.Templating.List[i].Query != "prometheus" {
		t.Fatal("no Prometheus data source variable")
	}
	ds := "${" + d.Templating.List[i].Name + "}"
	check := func(what string, m map[string]any) {
		if m["uid"] != ds || m["type"] != "prometheus" {
			t.Errorf("%s: data source %v, want the variable %s", what, m, ds)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			check("variable "+v.Name, v.Datasource)
		}
	}
	queries := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		check(fmt.Sprintf("panel %q", p.Title), p.Datasource)
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			check(fmt.Sprintf("panel %q's query", p.Title), tg.Datasource)
			queries++
		}
	}
	t.Logf("%d panels' queries", queries)
}
