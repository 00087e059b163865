package check

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"
)

// op builds a recorded operation for the tables below.
func op(client int, call, ret int64, in Input, out Output) Op {
	return Op{Client: client, Input: in, Output: out, Call: call, Return: ret}
}

func put(k, v string) Input                    { return Input{Kind: KindPut, Key: k, Value: v} }
func get(k string) Input                       { return Input{Kind: KindGet, Key: k} }
func del(k string) Input                       { return Input{Kind: KindDelete, Key: k} }
func cas(k, exp, v string) Input               { return Input{Kind: KindCAS, Key: k, Expect: exp, Value: v} }
func casAbsent(k, v string) Input              { return Input{Kind: KindCAS, Key: k, ExpectAbsent: true, Value: v} }
func found(v string) Output                    { return Output{Found: true, Value: v} }
func ok() Output                               { return Output{} }
func unknown() Output                          { return Output{Unknown: true} }
func existed(e bool) Output                    { return Output{Existed: e} }
func succeeded(b bool) Output                  { return Output{Succeeded: b} }
func history(ops ...Op) *History               { h := NewHistory(); h.ops = ops; return h }
func absent() Output                           { return Output{} }
func seq(ops ...Op) []Op                       { return ops }
func verdict(h *History) porcupine.CheckResult { return Check(h, 0).Verdict }

// TestCheckRecordedHistories: histories written down by hand, each either
// linearizable or not, checked both ways. The first illegal one is issue
// 20's: a Put answered, the next Put answered, then a Get that started
// after both returned the first value.
func TestCheckRecordedHistories(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []Op
		want porcupine.CheckResult
	}{
		{"stale read after two answered puts", seq(
			op(0, 0, 10, put("k0", "A"), ok()),
			op(0, 11, 20, put("k0", "B"), ok()),
			op(1, 21, 30, get("k0"), found("A")),
		), porcupine.Illegal},
		{"a read concurrent with a put may see either", seq(
			op(0, 0, 10, put("k0", "A"), ok()),
			op(0, 11, 30, put("k0", "B"), ok()),
			op(1, 12, 20, get("k0"), found("A")),
			op(2, 13, 21, get("k0"), found("B")),
		), porcupine.Ok},
		{"reads concurrent with a put may not go back", seq(
			op(0, 0, 10, put("k0", "A"), ok()),
			op(0, 11, 40, put("k0", "B"), ok()),
			op(1, 12, 20, get("k0"), found("B")),
			op(2, 21, 30, get("k0"), found("A")),
		), porcupine.Illegal},
		{"a write of unknown outcome may show up later", seq(
			op(0, 0, 10, put("k0", "A"), unknown()),
			op(1, 100, 110, get("k0"), absent()),
			op(1, 120, 130, get("k0"), found("A")),
		), porcupine.Ok},
		{"a write of unknown outcome may never show up", seq(
			op(0, 0, 10, put("k0", "A"), unknown()),
			op(1, 100, 110, get("k0"), absent()),
		), porcupine.Ok},
		{"but once seen it cannot vanish", seq(
			op(0, 0, 10, put("k0", "A"), unknown()),
			op(1, 100, 110, get("k0"), found("A")),
			op(1, 120, 130, get("k0"), absent()),
		), porcupine.Illegal},
		{"a read of a value never written", seq(
			op(0, 0, 10, put("k0", "A"), ok()),
			op(1, 20, 30, get("k0"), found("Z")),
		), porcupine.Illegal},
		{"delete reports whether the key existed", seq(
			op(0, 0, 10, put("k0", "A"), ok()),
			op(1, 20, 30, del("k0"), existed(true)),
			op(1, 40, 50, del("k0"), existed(false)),
			op(2, 60, 70, get("k0"), absent()),
		), porcupine.Ok},
		{"a delete that says a present key was absent", seq(
			op(0, 0, 10, put("k0", "A"), ok()),
			op(1, 20, 30, del("k0"), existed(false)),
		), porcupine.Illegal},
		{"compare-and-swap holds on the current value", seq(
			op(0, 0, 10, casAbsent("k0", "A"), succeeded(true)),
			op(0, 20, 30, cas("k0", "A", "B"), succeeded(true)),
			op(1, 40, 50, cas("k0", "A", "C"), succeeded(false)),
			op(1, 60, 70, get("k0"), found("B")),
		), porcupine.Ok},
		{"a compare-and-swap that succeeded on a stale value", seq(
			op(0, 0, 10, put("k0", "A"), ok()),
			op(0, 20, 30, put("k0", "B"), ok()),
			op(1, 40, 50, cas("k0", "A", "C"), succeeded(true)),
		), porcupine.Illegal},
		{"keys are independent", seq(
			op(0, 0, 10, put("k0", "A"), ok()),
			op(1, 0, 10, put("k1", "X"), ok()),
			op(2, 20, 30, get("k1"), found("X")),
			op(2, 40, 50, get("k0"), found("A")),
		), porcupine.Ok},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Check(history(tc.ops...), 0)
			if res.Verdict != tc.want {
				t.Fatalf("verdict %s, want %s", res.Verdict, tc.want)
			}
			v := res.Violations()
			if (tc.want == porcupine.Illegal) != (len(v) > 0) || (len(v) > 0 && !strings.Contains(v[0], "key k")) {
				t.Fatalf("violations %q for verdict %s", v, res.Verdict)
			}
			if tc.want == porcupine.Illegal && !strings.HasPrefix(res.String(), "NOT LINEARIZABLE") {
				t.Fatalf("verdict line %q", res.String())
			}
		})
	}
}

// TestSaveLoadVisualize: a history round-trips through its file, is
// checked the same, and a violation's visualisation is written; a damaged
// file is refused with a message naming the operation.
func TestSaveLoadVisualize(t *testing.T) {
	dir := t.TempDir()
	h := history(
		op(0, 0, 10, put("k0", "A"), ok()),
		op(0, 11, 20, put("k0", "B"), ok()),
		op(1, 21, 30, get("k0"), found("A")),
	)
	h.Note("kill -9 primary")
	path := filepath.Join(dir, "history.json")
	if err := h.Save(path); err != nil {
		t.Fatal(err)
	}
	back, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if verdict(back) != porcupine.Illegal || len(back.Events()) != 1 {
		t.Fatalf("loaded history: %s, events %v", verdict(back), back.Events())
	}
	html := filepath.Join(dir, "history.html")
	if err := Check(back, 0).Visualize(html); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(html); err != nil || !strings.Contains(string(b), "kill -9 primary") {
		t.Fatalf("visualisation: %v (%d bytes, has the event: %v)", err, len(b), strings.Contains(string(b), "kill -9 primary"))
	}
	for _, bad := range []string{
		`{"ops":[{"input":{"kind":9,"key":"k"}}]}`,
		`{"ops":[{"input":{"kind":1,"key":"k"},"call_ns":10,"return_ns":5}]}`,
		`{"ops":`,
	} {
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path); err == nil {
			t.Fatalf("Load(%s) = nil error", bad)
		}
	}
}
