package monitoring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bin returns the path of a Prometheus program, from the directory
// $PROMETHEUS_BIN that make test provides (tools/testenv installs
// Debian's prometheus package when it is missing).
func bin(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(env(t, "PROMETHEUS_BIN"), name)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return path
}

// promServer is a Prometheus server of the test's own: a free port, its
// data in the test's temporary directory, scraping one target every
// second and evaluating the rule files as often.
type promServer struct {
	t   *testing.T
	url string
}

func startPrometheus(t *testing.T, target string, ruleFiles ...string) *promServer {
	t.Helper()
	dir := t.TempDir()
	var rules strings.Builder
	for _, f := range ruleFiles {
		abs, err := filepath.Abs(f)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&rules, "  - %q\n", abs)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
%sscrape_configs:
  - job_name: %s
    static_configs:
      - targets: [%q]
`, rules.String(), jobName, target)
	configPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	logPath := filepath.Join(dir, "prometheus.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin(t, "prometheus"),
		"--config.file="+configPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--storage.tsdb.retention.time=1h",
		"--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Dir = dir
	cmd.SysProcAttr = dieWithTest()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("prometheus's log:\n%s", tail(string(b), 40))
		}
	})
	p := &promServer{t: t, url: "http://" + addr}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("prometheus exited while starting:\n%s", tail(string(b), 40))
		default:
		}
		resp, err := http.Get(p.url + "/-/ready")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready in 2 minutes: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// apiResponse is the envelope of Prometheus's HTTP API.
type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
}

// get calls the HTTP API and returns its data, or an error for a request
// Prometheus refused (a query it cannot parse, for one).
func (p *promServer) get(path string, params url.Values) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+path+"?"+params.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r apiResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	return r.Data, nil
}

// sample is one series of an instant query's result.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query runs an instant query and returns its series; a scalar counts as
// one.
func (p *promServer) query(expr string) ([]sample, error) {
	data, err := p.get("/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		return nil, err
	}
	var r struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, err
	}
	switch r.ResultType {
	case "vector":
		var out []sample
		return out, json.Unmarshal(r.Result, &out)
	case "scalar":
		return []sample{{}}, nil
	}
	return nil, fmt.Errorf("query %s: a %s, not a vector", expr, r.ResultType)
}

// labelValues returns the values of label on the series match selects.
func (p *promServer) labelValues(label, match string) ([]string, error) {
	data, err := p.get("/api/v1/label/"+url.PathEscape(label)+"/values", url.Values{"match[]": {match}})
	if err != nil {
		return nil, err
	}
	var out []string
	return out, json.Unmarshal(data, &out)
}

// rule is a rule as /api/v1/rules reports it.
type rule struct {
	Name      string `json:"name"`
	Query     string `json:"query"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
	State     string `json:"state"`
	Type      string `json:"type"`
}

// rules returns the rules Prometheus loaded, by name.
func (p *promServer) rules() (map[string]rule, error) {
	data, err := p.get("/api/v1/rules", nil)
	if err != nil {
		return nil, err
	}
	var r struct {
		Groups []struct {
			Rules []rule `json:"rules"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, err
	}
	out := map[string]rule{}
	for _, g := range r.Groups {
		for _, ru := range g.Rules {
			out[ru.Name] = ru
		}
	}
	return out, nil
}

// up reports whether the last scrape of the job succeeded.
func (p *promServer) up() bool {
	res, err := p.query(`up{job="` + jobName + `"} == 1`)
	return err == nil && len(res) == 1
}

func (s sample) value() float64 {
	str, _ := s.Value[1].(string)
	f, _ := strconv.ParseFloat(str, 64)
	return f
}
