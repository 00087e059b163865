package monitoring

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// wantAlerts are the alerts the rule file must define (it may define more).
var wantAlerts = []string{
	"WalshipReplicaLagHigh",
	"WalshipReplicaDisconnected",
	"WalshipSyncReplicationUnavailable",
	"WalshipLogStoreBehind",
	"WalshipWALRetentionNearLimit",
	"WalshipFsyncErrors",
	"WalshipPrimaryNotTakingWrites",
	"WalshipMembershipChangeStuck",
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	rules, err := parseRules(readRepoFile(t, rulesPath))
	if err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	if len(rules) == 0 {
		t.Fatalf("%s: no rules found", rulesPath)
	}
	return rules
}

func TestAlertRules(t *testing.T) {
	rules := loadRules(t)
	anchors := runbookAnchors(readRepoFile(t, runbookPath))
	seen := map[string]bool{}
	for _, r := range rules {
		if r.Kind != "alert" {
			continue
		}
		seen[r.Name] = true
		where := r.Name + " (" + rulesPath + ":" + itoa(r.Line) + ")"
		if strings.TrimSpace(r.Expr) == "" {
			t.Errorf("%s: no expr", where)
		}
		switch sev := r.Labels["severity"]; sev {
		case "page", "ticket":
		default:
			t.Errorf("%s: severity %q, want page or ticket", where, sev)
		}
		for _, k := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[k]) == "" {
				t.Errorf("%s: annotation %s missing or empty", where, k)
			}
		}
		if d := r.Annotations["description"]; !strings.Contains(d, "$labels") || !strings.Contains(d, "$value") {
			t.Errorf("%s: description should name the affected series ($labels) and the value ($value): %q", where, d)
		}
		// The RUNBOOK's commands take a gRPC address; Prometheus knows the
		// metrics address: every alert names both.
		if g := r.Annotations["grpc_address"]; !strings.Contains(g, "walship:server_info:last1h") {
			t.Errorf("%s: annotation grpc_address %q does not read walship:server_info:last1h", where, g)
		}
		if m := r.Annotations["metrics_address"]; m != "{{ $labels.instance }}" {
			t.Errorf("%s: annotation metrics_address %q, want {{ $labels.instance }}", where, m)
		}
		url := r.Annotations["runbook_url"]
		_, anchor, ok := strings.Cut(url, "docs/RUNBOOK.md#")
		switch {
		case !ok:
			t.Errorf("%s: runbook_url %q does not point into docs/RUNBOOK.md#", where, url)
		case !anchors[anchor]:
			t.Errorf("%s: runbook_url anchor #%s is not a heading of %s", where, anchor, runbookPath)
		case anchor != strings.ToLower(r.Name):
			t.Errorf("%s: runbook_url anchor #%s, want #%s (the alert's own section)", where, anchor, strings.ToLower(r.Name))
		}
	}
	for _, a := range wantAlerts {
		if !seen[a] {
			t.Errorf("%s: alert %s is missing", rulesPath, a)
		}
	}
}

func TestRuleMetricsKnown(t *testing.T) {
	for _, r := range loadRules(t) {
		refs := metricRefs(r.Expr)
		if len(refs) == 0 && !strings.Contains(r.Expr, "up{") {
			t.Errorf("rule %s uses no walship_ metric", r.Name)
		}
		for _, ref := range refs {
			if _, problem := resolveMetric(ref.Series); problem != "" {
				t.Errorf("rule %s: %s", r.Name, problem)
			}
		}
	}
}

var (
	headingRe = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	fenceRe   = regexp.MustCompile("^ {0,3}(```|~~~)")
	// htmlAnchorRe matches explicit anchors such as <a id="x"></a>.
	htmlAnchorRe = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
)

// runbookAnchors returns the anchors GitHub generates for the Markdown
// headings of doc (outside code fences), plus explicit <a id|name="...">.
func runbookAnchors(doc string) map[string]bool {
	anchors := map[string]bool{}
	count := map[string]int{}
	inFence := false
	for _, line := range strings.Split(doc, "\n") {
		if fenceRe.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range htmlAnchorRe.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		m := headingRe.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[2])
		if n := count[s]; n > 0 {
			anchors[s+"-"+itoa(n)] = true
		} else {
			anchors[s] = true
		}
		count[s]++
	}
	return anchors
}

// slug is GitHub's heading anchor: lower case, punctuation other than '-'
// and '_' dropped, spaces turned into '-'.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"WalshipReplicaLagHigh":      "walshipreplicalaghigh",
		"The catch-up ladder":        "the-catch-up-ladder",
		"What `it` means (v2.0)!":    "what-it-means-v20",
		"walship_wal_size_bytes ok?": "walship_wal_size_bytes-ok",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
	a := runbookAnchors("# A\n```\n# Not a heading\n```\n## A\n")
	if !a["a"] || !a["a-1"] || a["not-a-heading"] {
		t.Errorf("runbookAnchors = %v", a)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
