package grpcfuzz

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// harness runs inputs against an env in batches and collects findings.
type harness struct {
	e        *env
	bigValue int
	seeds    []seed
	frames   map[string][][]byte
	// baseline is the heap in use after the first batch, which warms up
	// every cache a call fills once (the authorization cache, reflection's
	// descriptors, gRPC's buffer pools, a connection per class and server).
	baseline uint64
	// heapSlack is how far above baseline the heap may be after a batch
	// and its cleanup (see TestGRPCSeeded's measurements).
	heapSlack uint64
	findings  []*finding
	byKey     map[string]*finding
	// journal, if set, gets every input before it is sent and a line
	// after it returns: when a server panics, the process dies, and the
	// process that started this one reads the input that was in flight.
	journal *os.File
}

// finding is one thing wrong, with a reproducer.
type finding struct {
	kind    string // "call", "cluster", "heap"
	summary string
	repro   string  // the input and what it did
	inputs  []input // replayable inputs (FuzzGRPC corpus files)
	count   int     // how many inputs showed it
	methods map[string]int
}

func newHarness(e *env, bigValue int, heapSlack uint64) *harness {
	ss := seeds(bigValue)
	return &harness{e: e, bigValue: bigValue, seeds: ss, frames: seedFrames(ss), heapSlack: heapSlack, byKey: map[string]*finding{}}
}

// add records a finding, or counts one more input that shows a finding
// already recorded (the same kind and summary but for its numbers).
func (h *harness) add(kind, summary, repro string, ins ...input) {
	key := kind + "|" + regexp.MustCompile(`[0-9]+`).ReplaceAllString(summary, "N")
	f := h.byKey[key]
	if f == nil {
		h.findings = append(h.findings, &finding{kind: kind, summary: summary, repro: repro, inputs: ins, methods: map[string]int{}})
		f = h.findings[len(h.findings)-1]
		h.byKey[key] = f
	}
	f.count++
	if kind == "call" {
		f.methods[ins[0].Method]++
	}
}

// call runs one input and records what is wrong with its outcome.
func (h *harness) call(in input) outcome {
	if h.journal != nil {
		fmt.Fprintf(h.journal, "BEGIN\n%s\n%s\n", in.corpus(), strings.ReplaceAll(fmt.Sprintf("%s on %s as %s", in.Method, h.e.name(in.target()), in.class()), "\n", " "))
	}
	out := h.e.run(in, h.frames)
	if h.journal != nil {
		fmt.Fprintf(h.journal, "END\n")
	}
	for _, p := range out.problems {
		h.add("call", p, h.e.describe(in, out), in)
	}
	return out
}

// batch runs ins, then checks the cluster (healthy and consistent;
// still able to hand over if a call moved the primary) and puts the
// fixture back (deleting what the calls wrote). A check that fails after a call that legitimately disrupts
// (a promotion, a fence, a policy) is repaired as an operator would
// first; if it still fails it is a finding, and the cluster is replaced
// so the run goes on.
func (h *harness) batch(tag string, ins []input) error {
	var disrupted []input
	moved := false
	orphans := h.e.orphans()
	for _, in := range ins {
		out := h.call(in)
		if h.e.disruptive(in, out) {
			disrupted = append(disrupted, in)
			switch in.Method {
			case "/walship.v1.AdminService/Promote", "/walship.v1.AdminService/Switchover", "/walship.v1.EpochService/Fence":
				moved = moved || out.code == codes.OK
			}
		}
	}
	if now := h.e.orphans(); !moved && now > orphans {
		// Cutting a log store's entries is what a new primary does to a
		// tail its epoch did not keep; with the same primary throughout,
		// nothing may.
		var repro strings.Builder
		fmt.Fprintf(&repro, "the log store went from %d to %d orphan files in a batch that changed no primary; its Append calls:", orphans, now)
		for _, in := range ins {
			if in.Method == "/walship.v1.LogStoreService/Append" {
				fmt.Fprintf(&repro, "\n  %s on %s as %s (seed %d): %s", in.Method, h.e.name(in.target()), in.class(), in.Seed, showFrame(in.Msg, h.e.methods[in.Method]))
			}
		}
		h.add("cluster", "the log store cut entries into orphans with no change of primary", repro.String(), ins...)
	}
	if len(disrupted) > 0 {
		h.e.settle(time.Now())
	}
	err := h.e.healthy(tag)
	if err != nil && len(disrupted) > 0 {
		h.e.repair()
		err = h.e.healthy(tag + " after a repair")
	}
	if err == nil && moved {
		err = h.e.handover(tag)
	}
	if err == nil {
		// The fixture writes and deletes through the primary: a
		// disruption that took a moment to land (a log store moved to
		// another epoch) shows here.
		if err = h.e.fixture(h.bigValue); err != nil && len(disrupted) > 0 {
			h.e.repair()
			err = h.e.fixture(h.bigValue)
		}
	}
	if err != nil {
		var repro strings.Builder
		suspects := disrupted
		if len(suspects) == 0 {
			suspects = ins
		}
		fmt.Fprintf(&repro, "after %d calls, of which these may change the cluster's state:", len(ins))
		for _, in := range suspects {
			fmt.Fprintf(&repro, "\n  %s on %s as %s (seed %d): %s", in.Method, h.e.name(in.target()), in.class(), in.Seed, trim(showFrame(in.Msg, h.e.methods[in.Method]), 200))
		}
		fmt.Fprintf(&repro, "\n  server log (newest lines):\n%s", indent(h.e.logs.tail(15), "    "))
		h.add("cluster", "the cluster is not healthy after a batch: "+err.Error(), repro.String(), suspects...)
		if err := h.e.restart(); err != nil {
			return fmt.Errorf("replace the broken cluster: %w", err)
		}
		h.baseline = 0 // a new cluster: a new baseline
		if err := h.e.fixture(h.bigValue); err != nil {
			return fmt.Errorf("fixture on a new cluster: %w", err)
		}
	}
	return nil
}

// heap checks that the heap in use is back near the baseline after ins
// (and the fixture's cleanup); the first check sets the baseline.
func (h *harness) heap(tag string, ins []input) uint64 {
	now := heapInUse()
	defer func() {
		if h.journal != nil {
			fmt.Fprintf(h.journal, "HEAP %s %d\n", tag, now)
		}
	}()
	switch {
	case h.baseline == 0:
		h.baseline = now
	case now > h.baseline+h.heapSlack:
		var repro strings.Builder
		fmt.Fprintf(&repro, "the heap in use went from %d MiB to %d MiB (bound: +%d MiB) over these %d calls:", h.baseline>>20, now>>20, h.heapSlack>>20, len(ins))
		for _, in := range ins {
			fmt.Fprintf(&repro, "\n  %s on %s as %s (seed %d, %d-byte message)", in.Method, h.e.name(in.target()), in.class(), in.Seed, len(in.Msg))
		}
		h.add("heap", fmt.Sprintf("heap in use +%d MiB above the baseline after %s", (now-h.baseline)>>20, tag), repro.String(), ins...)
		h.baseline = now // report each leak once, not in every later batch
	}
	return now
}

// report is every finding, most frequent first, with its reproducer.
func (h *harness) report() string {
	fs := append([]*finding(nil), h.findings...)
	sort.SliceStable(fs, func(i, j int) bool { return fs[i].kind < fs[j].kind })
	var b strings.Builder
	for i, f := range fs {
		fmt.Fprintf(&b, "\n%d. [%s] %s (seen %d×", i+1, f.kind, f.summary, f.count)
		if len(f.methods) > 0 {
			var ms []string
			for m, n := range f.methods {
				ms = append(ms, fmt.Sprintf("%s ×%d", m, n))
			}
			sort.Strings(ms)
			fmt.Fprintf(&b, ": %s", strings.Join(ms, ", "))
		}
		fmt.Fprintf(&b, ")\n   first: %s\n", indent(f.repro, "   ")[3:])
		if f.kind == "call" && len(f.inputs) == 1 {
			if c := f.inputs[0].corpus(); len(c) <= 2048 {
				fmt.Fprintf(&b, "   replay: save as testdata/fuzz/FuzzGRPC/NAME, run go test -run FuzzGRPC/NAME:\n%s\n", indent(c, "     "))
			} else {
				fmt.Fprintf(&b, "   replay: a %d-byte FuzzGRPC corpus file (set %s to a directory to have it written)\n", len(c), corpusEnv)
				h.save(f.inputs[0])
			}
		}
	}
	return b.String()
}

// corpusEnv names a directory where report writes the FuzzGRPC corpus
// files of its findings (testdata/fuzz/FuzzGRPC, to keep them as
// regression seeds).
const corpusEnv = "WALSHIP_GRPCFUZZ_CORPUS"

func (h *harness) save(in input) {
	dir := os.Getenv(corpusEnv)
	if dir == "" {
		return
	}
	name := fmt.Sprintf("%s-%d", strings.NewReplacer("/", "_", ".", "_").Replace(strings.TrimPrefix(in.Method, "/")), in.Seed)
	_ = os.MkdirAll(dir, 0o755)
	_ = os.WriteFile(filepath.Join(dir, name), []byte(in.corpus()), 0o644)
}

func indent(s, by string) string {
	return by + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+by)
}
