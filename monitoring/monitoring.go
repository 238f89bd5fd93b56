// Package monitoring is the operations pack of the idempotency
// middleware: a Grafana dashboard and Prometheus alerting rules over the
// metrics of contrib/idemotel, each alert with a runbook in
// docs/operations.md.
//
// The files are meant to be installed as they are: import dashboard.json
// into Grafana (it asks for the Prometheus data source), and add
// alerts.yaml to Prometheus's rule_files. They are embedded here too, so
// that a program can install the pack of the version it builds with:
//
//	os.WriteFile("/etc/prometheus/rules/idempotency.yaml", monitoring.AlertRules, 0o644)
//
// The tests of this module check the rules with promtool (alerts_test.yaml
// has a firing and a quiet case for each alert), and run a service with the
// middleware, contrib/idemotel and a Postgres store and outbox under a real
// Prometheus, through every outcome: every query of the dashboard, every
// alert's expression and every PromQL snippet of docs/operations.md must
// return data.
package monitoring

import _ "embed"

// Dashboard is the Grafana dashboard, dashboard.json.
//
//go:embed dashboard.json
var Dashboard []byte

// AlertRules is the Prometheus rule file of the alerts, alerts.yaml.
//
//go:embed alerts.yaml
var AlertRules []byte
