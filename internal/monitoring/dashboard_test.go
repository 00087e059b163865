package monitoring

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// dashboard is the part of a Grafana dashboard JSON model the tests read.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int             `json:"id"`
	Type        string          `json:"type"`
	Title       string          `json:"title"`
	Description string          `json:"description"`
	Datasource  json.RawMessage `json:"datasource"`
	Targets     []target        `json:"targets"`
	Panels      []panel         `json:"panels"` // a collapsed row's panels
}

type target struct {
	Expr       string          `json:"expr"`
	RefID      string          `json:"refId"`
	Datasource json.RawMessage `json:"datasource"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Multi      bool            `json:"multi"`
	IncludeAll bool            `json:"includeAll"`
}

// queryString is a variable's query, written either as a string or as
// {"query": "..."} (Grafana 10's Prometheus variable editor).
func (v variable) queryString() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	if json.Unmarshal(v.Query, &o) == nil {
		return o.Query
	}
	return ""
}

// datasourceUID accepts both forms Grafana writes: "uid" and {"uid": ...}.
func datasourceUID(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		UID string `json:"uid"`
	}
	if json.Unmarshal(raw, &o) == nil {
		return o.UID
	}
	return ""
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal([]byte(readRepoFile(t, dashboardPath)), &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// allPanels flattens rows: top-level panels and those inside collapsed rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// dashboardExprs returns every target expression with where it comes from.
func dashboardExprs(d dashboard) map[string]string {
	out := map[string]string{}
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			out[fmt.Sprintf("panel %d %q target %s", p.ID, p.Title, tg.RefID)] = tg.Expr
		}
	}
	return out
}

func TestDashboardModel(t *testing.T) {
	d := loadDashboard(t)
	if d.UID != "walship" || d.Title != "walship" {
		t.Errorf("uid %q title %q, want walship and walship", d.UID, d.Title)
	}
	if d.SchemaVersion < 38 {
		t.Errorf("schemaVersion %d, want 38 or later (Grafana 10+)", d.SchemaVersion)
	}

	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || v.queryString() != "prometheus" {
		t.Errorf("variable datasource: want type datasource with query prometheus, got %+v", v)
	}
	for _, name := range []string{"job", "namespace", "instance", "replica"} {
		v, ok := vars[name]
		if !ok {
			t.Errorf("variable %s missing", name)
			continue
		}
		if v.Type != "query" || !v.Multi || !v.IncludeAll || !strings.HasPrefix(v.queryString(), "label_values(") {
			t.Errorf("variable %s: want a multi-value label_values query variable with All, got type %q multi %v includeAll %v query %q",
				name, v.Type, v.Multi, v.IncludeAll, v.queryString())
		}
		if !strings.HasSuffix(v.queryString(), ", "+name+")") {
			t.Errorf("variable %s: query %q does not list label %s", name, v.queryString(), name)
		}
	}
	if q := vars["replica"].queryString(); !strings.HasPrefix(q, "label_values(walship_replication_lag_seconds") {
		t.Errorf("variable replica: query %q, want label_values(walship_replication_lag_seconds..., replica)", q)
	}

	ids := map[int]string{}
	graphs := 0
	for _, p := range allPanels(d.Panels) {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if other, dup := ids[p.ID]; dup {
			t.Errorf("%s: id also used by %q", where, other)
		}
		ids[p.ID] = p.Title
		if strings.TrimSpace(p.Title) == "" {
			t.Errorf("%s: no title", where)
		}
		if p.Type == "row" {
			continue
		}
		graphs++
		if strings.TrimSpace(p.Description) == "" {
			t.Errorf("%s: no description", where)
		}
		if uid := datasourceUID(p.Datasource); uid != "${datasource}" {
			t.Errorf("%s: datasource %q, want ${datasource}", where, uid)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no targets", where)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s target %s: empty expr", where, tg.RefID)
			}
			if uid := datasourceUID(tg.Datasource); uid != "${datasource}" {
				t.Errorf("%s target %s: datasource %q, want ${datasource}", where, tg.RefID, uid)
			}
		}
	}
	if graphs == 0 {
		t.Error("dashboard has no panels")
	}
}

// TestDashboardQueries checks that every metric a panel queries is known and
// that every selector is narrowed by the template variables.
func TestDashboardQueries(t *testing.T) {
	used := map[string]bool{}
	for where, expr := range dashboardExprs(loadDashboard(t)) {
		refs := metricRefs(expr)
		if len(refs) == 0 {
			t.Errorf("%s: no walship_ metric in %q", where, expr)
		}
		for _, ref := range refs {
			m, problem := resolveMetric(ref.Series)
			if problem != "" {
				t.Errorf("%s: %s", where, problem)
				continue
			}
			used[m.Name] = true
			want := []string{`job=~"$job"`, `namespace=~"$namespace"`, `instance=~"$instance"`}
			if slices.Contains(m.Labels, "replica") {
				want = append(want, `replica=~"$replica"`)
			}
			for _, w := range want {
				if !strings.Contains(ref.Selector, w) {
					t.Errorf("%s: %s%s is not filtered by %s", where, ref.Series, ref.Selector, w)
				}
			}
		}
	}
	// Every known metric should be on the dashboard somewhere.
	for _, m := range knownMetrics {
		if !used[m.Name] {
			t.Errorf("metric %s is not shown on the dashboard", m.Name)
		}
	}
}

func TestMetricRefs(t *testing.T) {
	got := metricRefs(`histogram_quantile(0.99, sum by (le) (rate(walship_commit_duration_seconds_bucket{job=~"$job"}[5m]))) / walship:commits:rate5m + walship_wal_last_lsn`)
	want := []metricRef{
		{Series: "walship_commit_duration_seconds_bucket", Selector: `{job=~"$job"}`},
		{Series: "walship_wal_last_lsn"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("metricRefs = %+v, want %+v", got, want)
	}
	for series, bad := range map[string]bool{
		"walship_commit_duration_seconds_bucket": false,
		"walship_commit_duration_seconds":        true, // histograms have no bare series
		"walship_commits_total":                  false,
		"walship_commits_total_bucket":           true,
		"walship_no_such_metric":                 true,
	} {
		if _, problem := resolveMetric(series); (problem != "") != bad {
			t.Errorf("resolveMetric(%s): problem %q, want problem: %v", series, problem, bad)
		}
	}
}
