package check

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Op is one recorded operation. Times are nanoseconds since the history
// began, on the monotonic clock.
type Op struct {
	Client int    `json:"client"`
	Input  Input  `json:"input"`
	Output Output `json:"output"`
	Call   int64  `json:"call_ns"`
	// Return is when the answer came; for an operation whose outcome is
	// unknown it is the time the caller gave up (kept for the record), and
	// the checker treats the operation as never returning.
	Return int64 `json:"return_ns"`
}

// Event is something that happened to the system during a history (a
// kill, a restart), shown in the visualisation beside the operations.
type Event struct {
	At   int64  `json:"at_ns"`
	What string `json:"what"`
}

// History is a concurrent recorder of operations. The zero value is not
// ready: use NewHistory.
type History struct {
	start time.Time

	mu     sync.Mutex
	ops    []Op
	events []Event
}

// NewHistory starts a history now.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the current time of the history's clock.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Add records an operation.
func (h *History) Add(op Op) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// Note records an event at the current time.
func (h *History) Note(format string, args ...any) {
	e := Event{At: h.Now(), What: fmt.Sprintf(format, args...)}
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
}

// Ops returns a copy of the recorded operations.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// Events returns a copy of the recorded events.
func (h *History) Events() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Event(nil), h.events...)
}

// savedHistory is the JSON form of a history file.
type savedHistory struct {
	Ops    []Op    `json:"ops"`
	Events []Event `json:"events,omitempty"`
}

// Save writes the history as JSON to path.
func (h *History) Save(path string) error {
	b, err := json.Marshal(savedHistory{Ops: h.Ops(), Events: h.Events()})
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// Load reads a history written by Save.
func Load(path string) (*History, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var sh savedHistory
	if err := json.Unmarshal(b, &sh); err != nil {
		return nil, fmt.Errorf("history %s: %w", path, err)
	}
	for i, op := range sh.Ops {
		if op.Input.Kind < KindPut || op.Input.Kind > KindCAS || op.Input.Key == "" {
			return nil, fmt.Errorf("history %s: ops[%d]: kind %d, key %q: want a kind of 1..4 and a key", path, i, op.Input.Kind, op.Input.Key)
		}
		if op.Return < op.Call {
			return nil, fmt.Errorf("history %s: ops[%d]: returns at %d, before its call at %d", path, i, op.Return, op.Call)
		}
	}
	return &History{ops: sh.Ops, events: sh.Events}, nil
}

// Result is a checked history.
type Result struct {
	Verdict porcupine.CheckResult
	// Counts of the operations checked.
	Ops, Reads, Writes, Unknown, Keys int
	// Span is the time from the first call to the last answer.
	Span time.Duration
	// Events are what happened to the system meanwhile.
	Events []Event

	info   porcupine.LinearizationInfo
	keys   []string       // the partitions' keys, in porcupine's order
	perKey map[string]int // operations per key
}

// OK reports whether the history is linearizable. A check that timed out
// (porcupine's Unknown) is not OK: it proves nothing.
func (r Result) OK() bool { return r.Verdict == porcupine.Ok }

// String is the one-line verdict.
func (r Result) String() string {
	verdict := "linearizable"
	switch r.Verdict {
	case porcupine.Illegal:
		verdict = "NOT LINEARIZABLE"
	case porcupine.Unknown:
		verdict = "UNDECIDED (the check timed out)"
	}
	var ev string
	if n := len(r.Events); n > 0 {
		ev = fmt.Sprintf(", %d fault events", n)
	}
	return fmt.Sprintf("%s: %d operations (%d reads, %d writes, %d of unknown outcome) on %d keys over %v%s",
		verdict, r.Ops, r.Reads, r.Writes, r.Unknown, r.Keys, r.Span.Round(time.Millisecond), ev)
}

// Check checks h for linearizability, giving up after timeout (0: never).
func Check(h *History, timeout time.Duration) Result {
	ops := h.Ops()
	res := Result{Ops: len(ops), Events: h.Events()}
	hist := make([]porcupine.Operation, len(ops))
	res.perKey = map[string]int{}
	var last int64
	for i, op := range ops {
		ret := op.Return
		if op.Output.Unknown {
			res.Unknown++
			ret = math.MaxInt64
		} else {
			last = max(last, op.Return)
		}
		if op.Input.Kind == KindGet {
			res.Reads++
		} else {
			res.Writes++
		}
		res.perKey[op.Input.Key]++
		hist[i] = porcupine.Operation{ClientId: op.Client, Input: op.Input, Call: op.Call, Output: op.Output, Return: ret}
	}
	res.Keys = len(res.perKey)
	for k := range res.perKey {
		res.keys = append(res.keys, k)
	}
	sort.Strings(res.keys) // partitionByKey's order
	if len(ops) > 0 {
		first := ops[0].Call
		for _, op := range ops {
			first = min(first, op.Call)
		}
		res.Span = time.Duration(last - first)
	}
	res.Verdict, res.info = porcupine.CheckOperationsVerbose(Model, hist, timeout)
	return res
}

// Visualize writes porcupine's HTML visualisation of the checked history
// to path, with the history's events as annotations.
func (r Result) Visualize(path string) error {
	ann := make([]porcupine.Annotation, 0, len(r.Events))
	for _, e := range r.Events {
		ann = append(ann, porcupine.Annotation{Tag: "faults", Start: e.At, Description: e.What, BackgroundColor: "#f4c7c3"})
	}
	r.info.AddAnnotations(ann)
	return porcupine.VisualizePath(Model, r.info, path)
}

// Violations describes each key whose history is not linearizable: the
// key, and the last operations of the longest linearizable prefix the
// checker found, followed by the first operations it could not place.
// Empty when the history is linearizable.
func (r Result) Violations() []string {
	if r.Verdict != porcupine.Illegal {
		return nil
	}
	var out []string
	for p, partials := range r.info.PartialLinearizationsOperations() {
		if p >= len(r.keys) {
			break
		}
		key := r.keys[p]
		var longest []porcupine.Operation
		for _, l := range partials {
			if len(l) > len(longest) {
				longest = l
			}
		}
		if len(longest) == r.perKey[key] {
			continue // this key is linearizable
		}
		tail := longest[max(0, len(longest)-3):]
		desc := make([]string, len(tail))
		for i, op := range tail {
			desc[i] = describe(op.Input.(Input), op.Output.(Output))
		}
		out = append(out, fmt.Sprintf("key %s: %d of its %d operations linearize, ending with %s", key, len(longest), r.perKey[key], strings.Join(desc, "; ")))
	}
	return out
}

// UnknownCauses counts the operations of unknown outcome by cause (their
// error, without the details that differ from one to the next).
func (h *History) UnknownCauses() map[string]int {
	out := map[string]int{}
	for _, op := range h.Ops() {
		if op.Output.Unknown {
			cause := op.Output.Err
			if i := strings.Index(cause, ": commit LSN"); i > 0 {
				cause = cause[:i]
			}
			if len(cause) > 120 {
				cause = cause[:120]
			}
			out[cause]++
		}
	}
	return out
}
