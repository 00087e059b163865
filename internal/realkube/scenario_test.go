package realkube

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/check"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// loadRun is what the checked workload saw around one disruption.
type loadRun struct {
	// Acked is the number of acknowledged writes (puts, deletes, CAS
	// answers) over the run.
	Acked int
	// LongestGap is the longest time between two acknowledged writes,
	// over the whole run: what a client through walship-rw waits at most.
	LongestGap time.Duration
	// Recovered is from the start of the disruption to the acknowledgement
	// that ended the longest gap after it: for a single fault, the time to
	// the first acknowledged write once the fault took writes away.
	Recovered time.Duration
	// Lost are the keys whose last acknowledged write the read-back did
	// not find (lostWrites); the linearizability check is stricter still.
	Lost []string
	// ReplicaReads were answered through walship-ro.
	ReplicaReads int

	acks []int64 // ackTimes, on the history's clock
	// trace is what the workload's connection to walship-rw did.
	trace *dialTrace
}

// recoveredFrom is from at (the history's clock: a kill) to the
// acknowledgement that ended the longest gap after it.
func (r loadRun) recoveredFrom(at int64) time.Duration {
	var gap, rec time.Duration
	for i := 1; i < len(r.acks); i++ {
		if g := time.Duration(r.acks[i] - r.acks[i-1]); r.acks[i] > at && g > gap {
			gap, rec = g, time.Duration(r.acks[i]-at)
		}
	}
	return rec
}

func (r loadRun) String() string {
	return fmt.Sprintf("%d writes acknowledged, %d reads through walship-ro; longest gap between acknowledged writes %v; disruption → end of the longest gap after it %v; %d acknowledged writes lost",
		r.Acked, r.ReplicaReads, r.LongestGap.Round(time.Millisecond), r.Recovered.Round(time.Millisecond), len(r.Lost))
}

// target is a deployment the workload runs against: its namespace and
// how to dial its Services.
type target struct {
	ns string
	// creds are the client's TLS credentials; nil dials in plaintext.
	creds credentials.TransportCredentials
}

// devTarget is the dev overlay's deployment (deployDev): plaintext.
var devTarget = target{ns: devNamespace}

// underLoad is underLoadOn the dev deployment.
func underLoad(t *testing.T, c *Cluster, name string, disrupt func(ctx context.Context, h *check.History) error) loadRun {
	t.Helper()
	return underLoadOn(t, c, devTarget, name, disrupt)
}

// underLoadOn runs the checked workload through walship-rw (each write's
// read-your-writes read through walship-ro), lets it write for a while on
// the cluster as it is, runs disrupt, and keeps the workload running until
// 50 more writes are acknowledged after disrupt returned. It then reads
// every key back through walship-rw and fails t unless the history is
// linearizable, no acknowledged write is lost and the replica reads kept
// their session guarantees. disrupt returns once the cluster is whole
// again (every pod Ready), so that the next test starts from one.
func underLoadOn(t *testing.T, c *Cluster, tg target, name string, disrupt func(ctx context.Context, h *check.History) error) loadRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	trace := newDialTrace()
	rw := tracedServiceConn(t, c, ctx, tg, "walship-rw", trace)
	ro := serviceConnTo(t, c, ctx, tg, "walship-ro")
	st, err := walshipv1.NewAdminServiceClient(rw).Status(ctx, &walshipv1.StatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("status through walship-rw: %v", err)
	}
	w := check.Workload{
		Primary: walshipv1.NewKVServiceClient(rw), Replica: walshipv1.NewKVServiceClient(ro),
		Prefix: fmt.Sprintf("realkube-%s-%d/", name, time.Now().UnixNano()), Concurrency: 4, Rate: 100,
		Defaults: st.DefaultPolicy, Crashes: true,
	}
	h := check.NewHistory()
	wctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	type outcome struct {
		session check.SessionReport
		err     error
	}
	done := make(chan outcome, 1)
	states := make(chan struct{})
	go func() { defer close(states); trace.watchStates(wctx, rw) }()
	defer func() { stopLoad(); <-states }()
	go func() {
		_, s, err := w.Run(wctx, 14*time.Minute, h)
		done <- outcome{s, err}
	}()
	ackedSince := func(from int64) int {
		n := 0
		for _, at := range ackTimes(h.Ops()) {
			if at > from {
				n++
			}
		}
		return n
	}
	if err := waitFor(ctx, 2*time.Minute, "50 writes before the disruption", func() error {
		if n := ackedSince(0); n < 50 {
			return fmt.Errorf("%d acknowledged", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	began := h.Now()
	h.Note("%s begins", name)
	if err := disrupt(ctx, h); err != nil {
		stopLoad()
		<-done
		t.Fatalf("%s: %v", name, err)
	}
	ended := h.Now()
	h.Note("%s done", name)
	if err := waitFor(ctx, 2*time.Minute, "50 writes after the disruption", func() error {
		if n := ackedSince(ended); n < 50 {
			return fmt.Errorf("%d acknowledged", n)
		}
		return nil
	}); err != nil {
		// Is it the Service, or the workload's connection through it?
		fresh := serviceConnTo(t, c, ctx, tg, "walship-rw")
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		_, perr := walshipv1.NewKVServiceClient(fresh).Put(pctx, &walshipv1.PutRequest{Key: w.Prefix + "probe", Value: []byte("x")})
		pcancel()
		eps, _ := c.KubectlOutput(ctx, nil, "-n", tg.ns, "get", "endpointslices", "-l", "kubernetes.io/service-name=walship-rw", "-o", "wide")
		// The workload's own errors since: unknown outcomes are in the
		// history (a refusal that certainly applied nothing is not).
		errs := map[string]int{}
		for _, op := range h.Ops() {
			if op.Call > ended && op.Output.Unknown {
				errs[op.Output.Err]++
			}
		}
		t.Fatalf("%v; writes of unknown outcome since, by error: %v; a Put through a new connection to walship-rw: %v; its endpoints:\n%s", err, errs, perr, eps)
	}
	stopLoad()
	out := <-done
	if out.err != nil {
		t.Fatal(out.err)
	}
	if err := w.ReadBack(ctx, h); err != nil {
		t.Fatal(err)
	}
	ops := h.Ops()
	run := loadRun{Lost: lostWrites(ops), ReplicaReads: out.session.Reads, trace: trace}
	acks := ackTimes(ops)
	run.Acked, run.acks = len(acks), acks
	var gapAfter time.Duration
	for i := 1; i < len(acks); i++ {
		gap := time.Duration(acks[i] - acks[i-1])
		run.LongestGap = max(run.LongestGap, gap)
		if acks[i] > began && gap > gapAfter {
			gapAfter, run.Recovered = gap, time.Duration(acks[i]-began)
		}
	}
	t.Logf("%s: %s", name, run)
	res := check.Check(h, 5*time.Minute)
	t.Logf("%s", res)
	if !res.OK() {
		t.Errorf("not linearizable: %v", res.Violations())
	}
	if len(run.Lost) > 0 {
		t.Errorf("acknowledged writes lost, keys: %v", run.Lost)
	}
	if len(out.session.Violations) > 0 {
		t.Errorf("replica reads through walship-ro broke their session guarantees: %v", out.session.Violations)
	}
	return run
}

// isWrite says whether an operation may change its key.
func isWrite(op check.Op) bool { return op.Input.Kind != check.KindGet }

// ackTimes returns when each acknowledged write was answered, in order
// (a CAS whose compare failed is an answer from the primary too).
func ackTimes(ops []check.Op) []int64 {
	var at []int64
	for _, op := range ops {
		if isWrite(op) && !op.Output.Unknown {
			at = append(at, op.Return)
		}
	}
	sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
	return at
}

// lostWrites returns the keys whose final read (the last Get of the key,
// the read-back) shows no write that can come after every acknowledged
// one: the value read was written by an operation that returned before
// the last acknowledged write of the key was even sent (or the key is
// absent with no such delete), so that write is gone. Writes of unknown
// outcome may land at any time after their call.
func lostWrites(ops []check.Op) []string {
	type keyOps struct {
		writes  []check.Op
		final   *check.Op
		lastAck int64 // the latest call of an acknowledged write that changed the key
		acked   bool
	}
	keys := map[string]*keyOps{}
	for i := range ops {
		op := ops[i]
		k := keys[op.Input.Key]
		if k == nil {
			k = &keyOps{}
			keys[op.Input.Key] = k
		}
		switch {
		case !isWrite(op):
			if k.final == nil || op.Call > k.final.Call {
				k.final = &ops[i]
			}
		case op.Input.Kind == check.KindCAS && !op.Output.Unknown && !op.Output.Succeeded:
			// Answered, changed nothing.
		default:
			k.writes = append(k.writes, op)
			if !op.Output.Unknown {
				k.acked = true
				k.lastAck = max(k.lastAck, op.Call)
			}
		}
	}
	var lost []string
	for key, k := range keys {
		if !k.acked || k.final == nil {
			continue
		}
		ok := false
		for _, wr := range k.writes {
			wrote := wr.Input.Kind != check.KindDelete
			matches := wrote == k.final.Output.Found && (!wrote || wr.Input.Value == k.final.Output.Value)
			if matches && (wr.Output.Unknown || wr.Return >= k.lastAck) {
				ok = true
				break
			}
		}
		if !ok {
			lost = append(lost, key)
		}
	}
	sort.Strings(lost)
	return lost
}

// podsWith returns the names of the namespace's pods with a label
// selector, sorted.
func podsWith(ctx context.Context, c *Cluster, selector string) ([]string, error) {
	out, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "pods", "-l", selector, "-o", `jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}`)
	if err != nil {
		return nil, err
	}
	names := strings.Fields(string(out))
	sort.Strings(names)
	return names, nil
}

// podField returns a jsonpath of a pod.
func podField(ctx context.Context, c *Cluster, pod, jsonpath string) (string, error) {
	out, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "pod", pod, "-o", "jsonpath="+jsonpath)
	return strings.TrimSpace(string(out)), err
}

// podConn dials a pod's port by its IP: the host routes to the pods'
// bridge.
func podConn(t *testing.T, c *Cluster, ctx context.Context, pod, port string) *grpc.ClientConn {
	t.Helper()
	ip, err := podField(ctx, c, pod, "{.status.podIP}")
	if err != nil || ip == "" {
		t.Fatalf("%s's IP: %q, %v", pod, ip, err)
	}
	conn, err := grpc.NewClient(ip+":"+port, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// logFollower is `kubectl logs -f` of a pod's container, kept until the
// container exits.
type logFollower struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
}

func (f *logFollower) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.buf.Write(p)
}

// followLogs follows a pod's log, from its container's start: a container
// that exits before the stream is up still shows its whole log.
func followLogs(ctx context.Context, c *Cluster, pod string) (*logFollower, error) {
	f := &logFollower{done: make(chan struct{})}
	cmd := exec.CommandContext(ctx, c.bin("kubectl"), "--kubeconfig", c.Kubeconfig, "-n", devNamespace, "logs", "-f", pod)
	cmd.Stdout = f
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = cmd.Wait(); close(f.done) }()
	return f, nil
}

// wait returns the log once the stream ended (the container exited), or
// an error after timeout.
func (f *logFollower) wait(ctx context.Context, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-f.done:
	case <-t.C:
		return "", fmt.Errorf("the log stream did not end within %s", timeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.buf.String(), nil
}
