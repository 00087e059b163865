// Package monitoring holds no code, only tests: they check walship's
// monitoring artifacts, which live outside Go.
//
//   - deploy/prometheus/walship-rules.yaml (alerting and recording rules) is
//     valid (`promtool check rules`) and passes its unit tests
//     deploy/prometheus/walship-rules_test.yaml (`promtool test rules`);
//     deploy/prometheus/prometheus.yml is a valid config; every PromQL
//     expression of the dashboard parses. These skip when promtool is not
//     on PATH (Debian package `prometheus`).
//   - every alert has a severity (page or ticket), a summary, a description
//     naming $labels and $value, and a runbook_url whose anchor is a heading
//     of docs/RUNBOOK.md.
//   - deploy/grafana/walship.json (the Grafana dashboard) has the expected
//     uid, schema version and template variables; every panel has a title,
//     a description, the ${datasource} data source and a non-empty query;
//     panel ids are unique; every query is filtered by $job and $namespace
//     (and $replica where the metric has a replica label).
//   - every walship_* metric named by a rule or a panel is in knownMetrics,
//     the list of metrics the services export (metrics_test.go), so a
//     renamed metric cannot silently empty a panel or an alert.
package monitoring
