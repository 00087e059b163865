package monitoring

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// family is one metric family of a Prometheus text exposition.
type family struct {
	Name   string
	Type   string
	Labels map[string]bool // label names on its samples, without le and quantile
}

var (
	typeLine   = regexp.MustCompile(`^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$`)
	sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+( \S+)?$`)
	labelPair  = regexp.MustCompile(`\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?`)
)

// parseExposition reads the families of a text exposition (format 0.0.4):
// their TYPE and the label names their samples carry.
func parseExposition(text string) (map[string]*family, error) {
	fams := map[string]*family{}
	for i, line := range strings.Split(text, "\n") {
		switch {
		case line == "" || strings.HasPrefix(line, "# HELP "):
			continue
		case strings.HasPrefix(line, "#"):
			m := typeLine.FindStringSubmatch(line)
			if m == nil {
				return nil, fmt.Errorf("line %d: unexpected comment %q", i+1, line)
			}
			if _, dup := fams[m[1]]; dup {
				return nil, fmt.Errorf("line %d: second TYPE for %s", i+1, m[1])
			}
			fams[m[1]] = &family{Name: m[1], Type: m[2], Labels: map[string]bool{}}
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("line %d: not a sample: %q", i+1, line)
		}
		f := fams[m[1]]
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if f != nil {
				break
			}
			if base, ok := strings.CutSuffix(m[1], suffix); ok {
				if bf := fams[base]; bf != nil && (bf.Type == histogram || bf.Type == "summary") {
					f = bf
				}
			}
		}
		if f == nil {
			return nil, fmt.Errorf("line %d: sample %s has no TYPE line", i+1, m[1])
		}
		rest := m[2]
		for rest != "" {
			lm := labelPair.FindStringSubmatchIndex(rest)
			if lm == nil || lm[0] != 0 {
				return nil, fmt.Errorf("line %d: bad labels %q", i+1, m[2])
			}
			if name := rest[lm[2]:lm[3]]; name != "le" && name != "quantile" {
				f.Labels[name] = true
			}
			rest = rest[lm[1]:]
		}
	}
	return fams, nil
}

func TestParseExposition(t *testing.T) {
	fams, err := parseExposition(`# HELP a_total A.
# TYPE a_total counter
a_total{x="1",y="q\"uo,te"} 3
# TYPE h_seconds histogram
h_seconds_bucket{c="m",le="0.1"} 1
h_seconds_bucket{c="m",le="+Inf"} 1
h_seconds_sum{c="m"} 0.05
h_seconds_count{c="m"} 1
# TYPE g gauge
g 1.5e+06
`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for n, f := range fams {
		got[n] = f.Type + " " + strings.Join(slices.Sorted(maps.Keys(f.Labels)), ",")
	}
	want := map[string]string{"a_total": "counter x,y", "h_seconds": "histogram c", "g": "gauge "}
	if !maps.Equal(got, want) {
		t.Errorf("parseExposition = %v, want %v", got, want)
	}
	for _, bad := range []string{"x 1\n", "# TYPE x counter\nx{a=1} 1\n", "# TYPE x counter\n# TYPE x counter\n"} {
		if _, err := parseExposition(bad); err == nil {
			t.Errorf("parseExposition accepted %q", bad)
		}
	}
}

var metricNameRe = regexp.MustCompile(`\bwalship_[a-z0-9_]*[a-z0-9]`)

// metricNamesIn returns the walship_* names a Markdown document mentions,
// histogram series (_bucket, _sum, _count) folded into their family when
// the family is known.
func metricNamesIn(doc string) map[string]bool {
	out := map[string]bool{}
	for _, ix := range metricNameRe.FindAllStringIndex(doc, -1) {
		n := doc[ix[0]:ix[1]]
		if ix[1] < len(doc) && strings.ContainsRune("*_", rune(doc[ix[1]])) {
			continue // a pattern such as walship_replica_*, not a name
		}
		if m, problem := resolveMetric(n); problem == "" && m.Type == histogram {
			n = m.Name
		}
		out[n] = true
	}
	return out
}
