package grpcfuzz

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
)

// Sizes of the runs. The large fixture value is a quarter of the value
// limit, so that the largest Txn of gets of it asks for 256 MiB: enough
// to see an unbudgeted response, little enough for a shared CI machine.
const (
	bigValue = 256 << 10
	// maxBytes bounds the mutator's huge fields: about the primary's
	// message limit (--max-value-bytes + 1 MiB + a key), sometimes just
	// past it.
	maxBytes = 2 << 20
	// heapSlack is how far above its baseline the heap in use may be
	// after a batch and its cleanup. Measured with -race on runs of 10
	// batches of valid requests only (seeds 1 and 2): the heap after each
	// batch stayed within -3.7..+3.8 MiB of the baseline (gRPC's buffer
	// pools, the WAL index, a role change's new server). On main, where
	// the UTF-8 check keeps every request it refused, the default run's
	// heap climbed to +10 or +11 MiB by its fourth or fifth batch (a role
	// change frees a data node's share, the log store's stays).
	heapSlack = 8 << 20
	// heapEvery is how many FuzzGRPC inputs run between heap checks.
	heapEvery = 50
)

// FuzzGRPC sends one input to a server of an in-process cluster (mTLS,
// the default policy) and checks the answer, then that the cluster is
// still healthy and consistent, and, replaying its corpus (not under
// -fuzz), every heapEvery inputs that the heap is back near its
// baseline. Its seeds are a valid request of every
// method, each as a class allowed to send it; `go test -fuzz=FuzzGRPC`
// mutates them (the bytes, and through Seed the schema-aware mutations
// and a stream's script). A server that panics kills the worker, and the
// fuzzer saves the input it was running.
func FuzzGRPC(f *testing.F) {
	for _, s := range seeds(bigValue) {
		in := seedInput(s)
		f.Add(in.Node, in.Method, in.Class, in.Seed, in.Msg)
	}
	dir := f.TempDir()
	// Started by the first input: the fuzzing coordinator runs this
	// function too, only to collect the seeds.
	var h *harness
	var recent []input
	execs := 0
	f.Cleanup(func() {
		if h != nil {
			if err := h.e.stop(); err != nil {
				f.Logf("stop the cluster: %v", err)
			}
		}
	})
	f.Fuzz(func(t *testing.T, node uint8, method string, class uint8, seed uint64, msg []byte) {
		if h == nil {
			e, err := startEnv(dir, maxBytes)
			if err != nil {
				t.Fatal(err)
			}
			h = newHarness(e, bigValue, heapSlack)
			if err := e.fixture(bigValue); err != nil {
				t.Fatal(err)
			}
		}
		in := input{Node: node, Method: method, Class: class, Seed: seed, Msg: msg}
		// Each input is judged alone (a finding is not "already known").
		h.findings, h.byKey = nil, map[string]*finding{}
		if err := h.batch("the input", []input{in}); err != nil {
			t.Fatal(err)
		}
		recent = append(recent, in)
		// Under -fuzz the heap is not checked: the fuzzing engine
		// allocates in this process too — its mutation scratch (20 MiB
		// once, internal/fuzz's mutator, seen in a heap profile) and
		// what minimizing a failing input takes (+18 MiB over 50
		// candidates) — and no baseline separates that from ours.
		// TestGRPCSeeded checks the heap after every batch, without the
		// engine. Replaying the corpus (plain go test) checks it here.
		if execs++; !fuzzing() && execs%heapEvery == 0 {
			h.heap(fmt.Sprintf("%d inputs", execs), recent)
			recent = recent[:0]
		}
		if len(h.findings) > 0 {
			t.Fatalf("%s", h.report())
		}
	})
}

// journalEnv names the journal file of a TestGRPCSeeded child process.
const journalEnv = "WALSHIP_GRPCFUZZ_JOURNAL"

// TestGRPCSeeded runs a bounded, deterministic fuzz of every method of
// every server (WALSHIP_GRPCFUZZ_SEED and WALSHIP_GRPCFUZZ_BATCHES change
// the run; the default is quick). It runs in a child process: the
// servers run in-process, so a panic in one kills the process, and this
// one then reports the input that was in flight from the child's
// journal, with the panic.
func TestGRPCSeeded(t *testing.T) {
	if path := os.Getenv(journalEnv); path != "" {
		seededRun(t, path)
		return
	}
	journal := filepath.Join(t.TempDir(), "journal")
	args := []string{"-test.run=^TestGRPCSeeded$", "-test.count=1", "-test.v"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).Round(time.Second).String())
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), journalEnv+"="+journal)
	out, err := cmd.CombinedOutput()
	if err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "grpcfuzz: ") {
				t.Log(strings.TrimSpace(l))
			}
		}
		return
	}
	j, _ := os.ReadFile(journal)
	if inflight := inFlight(j); inflight != "" {
		for _, sign := range []string{"panic: ", "fatal error: ", "WARNING: DATA RACE"} {
			if i := bytes.Index(out, []byte(sign)); i >= 0 {
				t.Fatalf("the process died (%s) while this input was in flight:\n%s\n\n%s", strings.TrimSpace(sign), inflight, trim(string(out[i:]), 6000))
			}
		}
	}
	t.Fatalf("%v:\n%s", err, out)
}

// inFlight is the journal's last input that began and never ended, or "".
func inFlight(journal []byte) string {
	i := bytes.LastIndex(journal, []byte("BEGIN\n"))
	if i < 0 || bytes.Contains(journal[i:], []byte("\nEND\n")) {
		return ""
	}
	return string(journal[i+len("BEGIN\n"):])
}

// seededRun is the child's run: every seed as it is, then batches of
// random inputs drawn from a fixed seed, every one checked.
func seededRun(t *testing.T, journalPath string) {
	journal, err := os.Create(journalPath)
	if err != nil {
		t.Fatal(err)
	}
	defer journal.Close()
	rseed, batches, size := uint64(33), 6, 30
	if s := os.Getenv("WALSHIP_GRPCFUZZ_SEED"); s != "" {
		if rseed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	if s := os.Getenv("WALSHIP_GRPCFUZZ_BATCHES"); s != "" {
		if batches, err = strconv.Atoi(s); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	e, err := startEnv(t.TempDir(), maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.stop(); err != nil {
			t.Errorf("stop the cluster: %v", err)
		}
	})
	h := newHarness(e, bigValue, heapSlack)
	h.journal = journal
	if err := e.fixture(bigValue); err != nil {
		t.Fatal(err)
	}
	var methods []string
	for m := range e.methods {
		methods = append(methods, m)
	}
	sort.Strings(methods)
	bySeed := map[string][]seed{}
	for _, s := range h.seeds {
		bySeed[s.method] = append(bySeed[s.method], s)
	}
	for _, m := range methods {
		if len(bySeed[m]) == 0 {
			t.Errorf("no seed for %s: add a valid request of it to seeds()", m)
		}
	}
	// A method no server has: every server must answer UNIMPLEMENTED.
	methods = append(methods, "/walship.v1.NoSuchService/Nothing")

	// First every seed as it is: valid requests, as the class they are
	// for; those that move the primary in a batch of their own, so that
	// the others are judged against an unchanged primary. Their heap is
	// the baseline.
	var ins, moving []input
	for _, s := range h.seeds {
		switch s.method {
		case "/walship.v1.AdminService/Promote", "/walship.v1.AdminService/Switchover", "/walship.v1.EpochService/Fence":
			moving = append(moving, seedInput(s))
		default:
			ins = append(ins, seedInput(s))
		}
	}
	calls := len(ins) + len(moving)
	if err := h.batch("the seeds", ins); err != nil {
		t.Fatal(err)
	}
	if err := h.batch("the seeds that move the primary", moving); err != nil {
		t.Fatal(err)
	}
	// Then every integer field of every seed at its extreme, the same way.
	var extremes, extremeMoving []input
	for _, s := range h.seeds {
		for _, in := range extremeInputs(s) {
			switch s.method {
			case "/walship.v1.AdminService/Promote", "/walship.v1.AdminService/Switchover", "/walship.v1.EpochService/Fence":
				extremeMoving = append(extremeMoving, in)
			default:
				extremes = append(extremes, in)
			}
		}
	}
	calls += len(extremes) + len(extremeMoving)
	if err := h.batch("the seeds at extreme integers", extremes); err != nil {
		t.Fatal(err)
	}
	if err := h.batch("the seeds that move the primary at extreme integers", extremeMoving); err != nil {
		t.Fatal(err)
	}
	h.heap("the seeds", append(ins, moving...))
	r := rand.New(rand.NewPCG(rseed, 0))
	for b := 1; b <= batches; b++ {
		ins = ins[:0]
		for range size {
			ins = append(ins, randomInput(r, methods, bySeed))
		}
		calls += len(ins)
		tag := fmt.Sprintf("batch %d", b)
		if err := h.batch(tag, ins); err != nil {
			t.Fatal(err)
		}
		heap := h.heap(tag, ins)
		t.Logf("grpcfuzz: %s: heap in use %.1f MiB (baseline %.1f MiB)", tag, float64(heap)/(1<<20), float64(h.baseline)/(1<<20))
	}
	t.Logf("grpcfuzz: %d calls to %d methods in %v (seed %d, %d batches); %d clusters; %d findings",
		calls, len(methods), time.Since(start).Round(time.Millisecond), rseed, batches, e.generation, len(h.findings))
	if len(h.findings) > 0 {
		t.Errorf("grpcfuzz: %d findings:%s", len(h.findings), h.report())
	}
}

// randomInput draws an input: a method; a seed of it (or nothing, for a
// method without one) sent to its server as its class most of the time,
// else to any server as any class; and a mutation seed.
func randomInput(r *rand.Rand, methods []string, bySeed map[string][]seed) input {
	in := input{Method: methods[r.IntN(len(methods))], Seed: r.Uint64() | 1}
	ss := bySeed[in.Method]
	if len(ss) > 0 {
		s := ss[r.IntN(len(ss))]
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.msg)
		if err != nil {
			panic(err)
		}
		in.Msg, in.Node, in.Class = b, uint8(s.node), uint8(s.class)
	}
	if len(ss) == 0 || r.IntN(3) == 0 {
		in.Node = uint8(r.IntN(int(numTargets)))
	}
	if len(ss) == 0 || r.IntN(3) == 0 {
		in.Class = uint8(r.IntN(int(numClasses)))
	}
	return in
}

// fuzzing reports whether this process runs the fuzzing engine (-fuzz),
// not only the corpus.
func fuzzing() bool {
	f := flag.Lookup("test.fuzz")
	return f != nil && f.Value.String() != ""
}
