package monitoring

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// This file reads the Prometheus rule file without a YAML library (none is
// in go.mod). It understands the subset the rule file is written in and
// fails loudly on anything else, so a construct it does not know cannot
// hide a rule: block mappings and sequences by indentation, plain,
// single-quoted and double-quoted one-line scalars, and literal (|) and
// folded (>) block scalars. The rule count is also cross-checked against
// `promtool check rules` (promtool_test.go).

// rule is one alerting or recording rule.
type rule struct {
	Kind        string // "alert" or "record"
	Name        string
	Expr        string
	For         string
	Labels      map[string]string
	Annotations map[string]string
	Line        int // 1-based line of "- alert:" / "- record:"
}

var ruleStart = regexp.MustCompile(`^(\s*)- (alert|record):(.*)$`)

// parseRules returns every rule in a Prometheus rule file.
func parseRules(text string) ([]rule, error) {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	var rules []rule
	for i := 0; i < len(lines); i++ {
		m := ruleStart.FindStringSubmatch(lines[i])
		if m == nil {
			if strings.Contains(lines[i], "alert:") || strings.Contains(lines[i], "record:") {
				if t := strings.TrimSpace(lines[i]); !strings.HasPrefix(t, "#") {
					return nil, fmt.Errorf("line %d: rule not written as \"- alert: NAME\" or \"- record: NAME\": %q", i+1, lines[i])
				}
			}
			continue
		}
		itemIndent := len(m[1]) + 2
		name, err := scalar(m[3])
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", i+1, err)
		}
		end := i + 1
		for end < len(lines) && (isBlank(lines[end]) || indentOf(lines[end]) >= itemIndent) {
			end++
		}
		body, err := parseMapping(lines, i+1, end, itemIndent)
		if err != nil {
			return nil, err
		}
		r := rule{Kind: m[2], Name: name, Line: i + 1}
		for k, v := range body {
			switch k {
			case "expr":
				r.Expr, err = v.str(k)
			case "for", "keep_firing_for":
				r.For, err = v.str(k)
			case "labels":
				r.Labels, err = v.strMap(k)
			case "annotations":
				r.Annotations, err = v.strMap(k)
			default:
				err = fmt.Errorf("unknown key %q", k)
			}
			if err != nil {
				return nil, fmt.Errorf("rule %s (line %d): %v", name, i+1, err)
			}
		}
		rules = append(rules, r)
		i = end - 1
	}
	return rules, nil
}

// node is a parsed YAML value: a scalar or a mapping.
type node struct {
	scalar  *string
	mapping map[string]node
}

func (n node) str(key string) (string, error) {
	if n.scalar == nil {
		return "", fmt.Errorf("%s: want a scalar", key)
	}
	return *n.scalar, nil
}

func (n node) strMap(key string) (map[string]string, error) {
	if n.mapping == nil {
		return nil, fmt.Errorf("%s: want a mapping", key)
	}
	out := make(map[string]string, len(n.mapping))
	for k, v := range n.mapping {
		s, err := v.str(key + "." + k)
		if err != nil {
			return nil, err
		}
		out[k] = s
	}
	return out, nil
}

var keyLine = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*):(?:\s+(.*))?$`)

// parseMapping parses lines[start:end] as a block mapping whose keys are at
// column indent.
func parseMapping(lines []string, start, end, indent int) (map[string]node, error) {
	out := map[string]node{}
	for i := start; i < end; {
		if isBlank(lines[i]) {
			i++
			continue
		}
		if ind := indentOf(lines[i]); ind != indent {
			return nil, fmt.Errorf("line %d: indentation %d, want %d: %q", i+1, ind, indent, lines[i])
		}
		m := keyLine.FindStringSubmatch(strings.TrimSpace(lines[i]))
		if m == nil {
			return nil, fmt.Errorf("line %d: not a \"key: value\" line: %q", i+1, lines[i])
		}
		key, val := m[1], strings.TrimSpace(m[2])
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("line %d: duplicate key %q", i+1, key)
		}
		// The value's lines: everything indented deeper than the key.
		j := i + 1
		for j < end && (isBlank(lines[j]) || indentOf(lines[j]) > indent) {
			j++
		}
		switch {
		case val == "" || strings.HasPrefix(val, "#"):
			child := firstIndent(lines, i+1, j)
			if child < 0 {
				return nil, fmt.Errorf("line %d: %s has no value", i+1, key)
			}
			mp, err := parseMapping(lines, i+1, j, child)
			if err != nil {
				return nil, err
			}
			out[key] = node{mapping: mp}
		case val[0] == '|' || val[0] == '>':
			s, err := blockScalar(lines[i+1:j], val)
			if err != nil {
				return nil, fmt.Errorf("line %d: %v", i+1, err)
			}
			out[key] = node{scalar: &s}
		default:
			if firstIndent(lines, i+1, j) >= 0 {
				return nil, fmt.Errorf("line %d: multi-line flow scalars are not supported: %q", i+1, lines[i])
			}
			s, err := scalar(val)
			if err != nil {
				return nil, fmt.Errorf("line %d: %v", i+1, err)
			}
			out[key] = node{scalar: &s}
		}
		i = j
	}
	return out, nil
}

// blockScalar joins the lines of a | or > block scalar (header e.g. "|-").
func blockScalar(lines []string, header string) (string, error) {
	style, chomp := header[0], strings.TrimSpace(header[1:])
	if i := strings.Index(chomp, "#"); i >= 0 {
		chomp = strings.TrimSpace(chomp[:i])
	}
	if chomp != "" && chomp != "-" && chomp != "+" {
		return "", fmt.Errorf("unsupported block scalar header %q", header)
	}
	ind := firstIndent(lines, 0, len(lines))
	var parts []string
	for _, l := range lines {
		if isBlank(l) {
			parts = append(parts, "")
			continue
		}
		parts = append(parts, l[ind:])
	}
	for len(parts) > 0 && parts[len(parts)-1] == "" {
		parts = parts[:len(parts)-1]
	}
	sep := "\n"
	if style == '>' {
		sep = " "
	}
	s := strings.Join(parts, sep)
	if chomp != "-" {
		s += "\n"
	}
	return s, nil
}

// scalar decodes a one-line scalar.
func scalar(v string) (string, error) {
	v = strings.TrimSpace(v)
	switch {
	case v == "":
		return "", nil
	case v[0] == '"':
		end := closingQuote(v)
		if end < 0 {
			return "", fmt.Errorf("unterminated double-quoted scalar %s", v)
		}
		if rest := strings.TrimSpace(v[end+1:]); rest != "" && !strings.HasPrefix(rest, "#") {
			return "", fmt.Errorf("text after quoted scalar: %s", v)
		}
		s, err := strconv.Unquote(v[:end+1])
		if err != nil {
			return "", fmt.Errorf("double-quoted scalar %s: %v", v, err)
		}
		return s, nil
	case v[0] == '\'':
		var b strings.Builder
		for i := 1; i < len(v); i++ {
			if v[i] == '\'' {
				if i+1 < len(v) && v[i+1] == '\'' {
					b.WriteByte('\'')
					i++
					continue
				}
				if rest := strings.TrimSpace(v[i+1:]); rest != "" && !strings.HasPrefix(rest, "#") {
					return "", fmt.Errorf("text after quoted scalar: %s", v)
				}
				return b.String(), nil
			}
			b.WriteByte(v[i])
		}
		return "", fmt.Errorf("unterminated single-quoted scalar %s", v)
	case strings.ContainsAny(v[:1], "{[&*!%@`"):
		return "", fmt.Errorf("unsupported YAML scalar %s", v)
	default:
		if i := strings.Index(v, " #"); i >= 0 {
			v = strings.TrimSpace(v[:i])
		}
		return v, nil
	}
}

// closingQuote returns the index of the '"' that closes the double-quoted
// scalar starting at v[0], or -1.
func closingQuote(v string) int {
	for i := 1; i < len(v); i++ {
		switch v[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

func isBlank(l string) bool {
	t := strings.TrimSpace(l)
	return t == "" || strings.HasPrefix(t, "#")
}

func indentOf(l string) int { return len(l) - len(strings.TrimLeft(l, " ")) }

// firstIndent is the indentation of the first non-blank line in
// lines[start:end], or -1.
func firstIndent(lines []string, start, end int) int {
	for i := start; i < end; i++ {
		if !isBlank(lines[i]) {
			return indentOf(lines[i])
		}
	}
	return -1
}

func TestParseRulesSubset(t *testing.T) {
	const in = `groups:
  - name: g
    rules:
      # a comment
      - record: a:b:c
        expr: sum(x)
      - alert: A
        expr: |
          x > 1
            and y
        for: 5m
        labels:
          severity: page   # trailing comment
        annotations:
          summary: 'it''s "x"'
          description: "v={{ $value }} \"q\""
      - alert: "B"
        expr: >-
          a
          b
`
	rules, err := parseRules(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 3 {
		t.Fatalf("got %d rules, want 3: %+v", len(rules), rules)
	}
	a := rules[1]
	if a.Kind != "alert" || a.Name != "A" || a.Expr != "x > 1\n  and y\n" || a.For != "5m" ||
		a.Labels["severity"] != "page" || a.Annotations["summary"] != `it's "x"` ||
		a.Annotations["description"] != `v={{ $value }} "q"` {
		t.Errorf("alert A parsed as %+v", a)
	}
	if rules[0].Kind != "record" || rules[0].Name != "a:b:c" || rules[0].Expr != "sum(x)" {
		t.Errorf("record parsed as %+v", rules[0])
	}
	if rules[2].Name != "B" || rules[2].Expr != "a b" {
		t.Errorf("alert B parsed as %+v", rules[2])
	}

	for _, bad := range []string{
		"      - alert: A\n        labels: {severity: page}\n",
		"      - alert: A\n        expr: \"x\n          y\"\n",
		"      - alert: A\n        labels:\n          severity: page\n         oops: 1\n",
		"      - alert: A\n        expr: x\n        expr: y\n",
		"      - alert: A\n        exp: x\n",
		"      -   alert: A\n",
	} {
		if _, err := parseRules(bad); err == nil {
			t.Errorf("parseRules accepted unsupported input:\n%s", bad)
		}
	}
}
