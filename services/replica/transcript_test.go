package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestTranscripts runs the replication scenarios in testdata/*.txt, as
// etcd-io/raft writes its own: a real replica driven by scripted fake
// primaries and a fake log store, one command at a time, each command
// printing what it observed (acks, hellos, status, reads) — never its
// input — so that a change of behaviour shows as a diff of the transcript.
// `go test ./services/replica/ -run TestTranscripts -rewrite` regenerates
// the expected output; read the diff line by line before committing it.
//
// Commands (arguments in brackets are optional):
//
// Histories (what primaries hold; these print nothing):
//
//	batch <h> [epoch=E] lsns=A..B   one transaction appended to history h
//	                                (created if new), one op a line:
//	                                "put KEY VALUE" or "del KEY"; it takes
//	                                LSNs A..B (one per op, then the commit)
//	fork <h> from=<g> [at=N]        h is g's history up to LSN N (all of it)
//
// Peers (fakes; their addresses print as their names):
//
//	new-primary <p>...              scripted ReplicationServices
//	serve-snapshot <p> <h> [commit=N]
//	                                p's Snapshot serves h's state as of now,
//	                                its commit_lsn N (default: its LSN)
//	logstore [serve=<h>] [first=N] [out-of-range] [silent] [vote-epoch=E] [vote-primary=ID@pN]
//	                                the log store (created at first use;
//	                                then given to the replica at start):
//	                                Read serves h's batches as of now (none
//	                                before LSN N: OUT_OF_RANGE), or fails
//	                                OUT_OF_RANGE, or sends nothing
//	logstore-snapshot <h>           the log store holds a base snapshot of
//	                                h's state as of now
//
// The replica:
//
//	start [primary=<p>] [fs=mem] [heartbeat=D] [flush-delay=D]
//	stop, restart                   print what Run returned
//	crash                           (fs=mem) the machine dies: nothing more
//	                                reaches the disk, what was not synced
//	                                is lost, and the replica is stopped
//	set-applied-marker <lsn> [readable]
//	                                (stopped) DataDir/applied says lsn
//	                                (applied; readable: reads were served
//	                                there)
//	set-vote <epoch>                (stopped) DataDir/vote promises epoch
//	                                to no one in particular
//	fail-snapshot-save              (fs=mem) the next snapshot save fails
//	injected                        how many injected failures happened
//
// A stream (p's latest, once accepted):
//
//	accept <p>                      wait for the replica's next stream to p;
//	                                prints its hello
//	send <p> <h> A..B [durable=N] [commit=N] [reply-at=(write,flush,apply)]
//	                                h's batches A..B; durable_lsn and
//	                                commit_lsn default to each batch's
//	                                last LSN
//	heartbeat <p> epoch=E last=L [durable=N] [commit=N] [reply] [primary-id=ID]
//	                                commit_lsn defaults to durable_lsn
//	end <p> [code=C] [msg=(M)]      end the stream: EOF, or status C
//	diverged <p> keep=N epoch=E [durable=N]
//	                                answer with Diverged and end the stream
//	await-ack <p> COND... [forbid=(COND, ...)]
//	                                read acks until one meets every COND
//	                                (written|flushed|applied, then
//	                                >=, <=, =, < or >, then an LSN); print
//	                                it, and every ack read that met all
//	                                of forbid
//	await-end <p>                   wait for the replica to end p's stream
//	snapshot-calls <p>              Snapshot calls p has had
//
// Observing the replica:
//
//	status                          positions, epochs, rung, history, orphans
//	state                           every pair, checked against the digest
//	get <key> [min-lsn=N] [wait=D]
//	watch [from=N] [wait=D]         a Watch of every key from start_lsn N
//	                                (default: now): its first message, or
//	                                its error
//	wait-applied <lsn>              wait for it, print the visible LSN
//	wait-vote <epoch>               wait for the promise, print it
//	metric <name> [label=value]
//	logstore-reads                  the log store reads since the last time
//	logstore-snapshot-calls         GetSnapshot calls the log store has had
//	fence epoch=E candidate=ID [addr=<p>]
//	vote-file                       the promise as saved in DataDir/vote
//	read-log from=A to=B            the replica's own log, as a log store's
//	stream-from-replica             a replication stream asked of the replica
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		e := &transcript{primaries: map[string]*fakePrimary{}, sessions: map[string]*session{},
			histories: map[string]*history{}, snapshots: map[string]servedSnapshot{}}
		datadriven.RunTest(t, path, e.run)
	})
}

// transcript is one scenario's world: the replica, its peers and the
// histories the peers hold.
type transcript struct {
	cfg       Config
	started   bool
	mem       *vfs.MemFS // nil: the real disk
	r         *running   // nil while stopped
	primaries map[string]*fakePrimary
	sessions  map[string]*session
	names     []string // address, name pairs
	histories map[string]*history
	ls        *fakeLogStore // nil until the logstore command

	// mu guards what the fakes' handlers read.
	mu        sync.Mutex
	snapshots map[string]servedSnapshot // by primary
	lsMode    string                    // serve, out-of-range or silent
	lsBatches []*walshipv1.WalBatch
	lsFirst   uint64 // Read refuses what is before it

	failSave  atomic.Bool  // the next snapshot save fails
	saveFails atomic.Int32 // snapshot saves failed so far
	crashed   atomic.Bool  // every operation that changes the disk fails
}

// servedSnapshot is what a primary's Snapshot serves.
type servedSnapshot struct {
	view   *state.View
	epoch  uint64
	commit uint64 // the header's commit_lsn
}

// history is a primary's log as the test built it: its batches and a
// model of the state they make.
type history struct {
	m       *model
	batches []*walshipv1.WalBatch
}

// command is one transcript command: how many plain arguments it takes
// (-1: any number), the names of the others, and what it does.
type command struct {
	plain int
	names []string
	run   func(e *transcript, t *testing.T, td *datadriven.TestData) string
}

// commands are the transcripts' commands (TestTranscripts lists them); metric
// also takes any label=value, await-ack any condition.
var commands = map[string]command{
	"batch":                   {1, []string{"epoch", "lsns"}, (*transcript).batch},
	"fork":                    {1, []string{"from", "at"}, (*transcript).fork},
	"new-primary":             {-1, nil, (*transcript).newPrimaries},
	"serve-snapshot":          {2, []string{"commit"}, (*transcript).serveSnapshot},
	"logstore":                {0, []string{"serve", "first", "out-of-range", "silent", "vote-epoch", "vote-primary"}, (*transcript).logstore},
	"logstore-snapshot":       {1, nil, (*transcript).logstoreSnapshot},
	"logstore-snapshot-calls": {0, nil, (*transcript).logstoreSnapshotCalls},
	"start":                   {0, []string{"primary", "fs", "heartbeat", "flush-delay"}, (*transcript).start},
	"stop":                    {0, nil, (*transcript).stop},
	"crash":                   {0, nil, (*transcript).crash},
	"restart":                 {0, nil, (*transcript).restart},
	"set-applied-marker":      {1, []string{"readable"}, (*transcript).setAppliedMarker},
	"set-vote":                {1, nil, (*transcript).setVote},
	"fail-snapshot-save":      {0, nil, (*transcript).failSnapshotSave},
	"injected":                {0, nil, (*transcript).injected},
	"accept":                  {1, nil, (*transcript).accept},
	"send":                    {3, []string{"durable", "commit", "reply-at"}, (*transcript).send},
	"heartbeat":               {1, []string{"epoch", "last", "durable", "commit", "reply", "primary-id", "advertise"}, (*transcript).heartbeat},
	"end":                     {1, []string{"code", "msg"}, (*transcript).end},
	"diverged":                {1, []string{"keep", "epoch", "durable"}, (*transcript).diverged},
	"await-ack":               {1, []string{"forbid"}, (*transcript).awaitAck},
	"await-end":               {1, nil, (*transcript).awaitEnd},
	"snapshot-calls":          {1, nil, (*transcript).snapshotCalls},
	"status":                  {0, nil, (*transcript).status},
	"state":                   {0, nil, (*transcript).state},
	"get":                     {1, []string{"min-lsn", "wait"}, (*transcript).get},
	"watch":                   {0, []string{"from", "wait"}, (*transcript).watch},
	"wait-applied":            {1, nil, (*transcript).waitApplied},
	"wait-vote":               {1, nil, (*transcript).waitVote},
	"metric":                  {1, nil, (*transcript).metric},
	"logstore-reads":          {0, nil, (*transcript).logstoreReads},
	"fence":                   {0, []string{"epoch", "candidate", "addr"}, (*transcript).fence},
	"vote-file":               {0, nil, (*transcript).voteFile},
	"read-log":                {0, []string{"from", "to"}, (*transcript).readLog},
	"stream-from-replica":     {0, nil, (*transcript).streamFromReplica},
}

// run runs one command, checking its arguments first (a typo must not
// leave a transcript testing less than it says), and prints the fakes'
// addresses as their names.
func (e *transcript) run(t *testing.T, td *datadriven.TestData) string {
	c, ok := commands[td.Cmd]
	if !ok {
		t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
	}
	plain := 0
	for i, a := range td.CmdArgs {
		switch {
		case slices.Contains(c.names, a.Key):
		case td.Cmd == "metric" && i > 0 && len(a.Vals) == 1:
		case td.Cmd == "await-ack" && i > 0: // conditions, parsed strictly
		case len(a.Vals) == 0 && (c.plain < 0 || plain < c.plain) && plain == i:
			plain++
		default:
			t.Fatalf("%s: %s does not take %s", td.Pos, td.Cmd, a.String())
		}
	}
	out := c.run(e, t, td)
	for i := 0; i+1 < len(e.names); i += 2 {
		out = strings.ReplaceAll(out, e.names[i], e.names[i+1])
	}
	return out
}

func (e *transcript) newPrimaries(t *testing.T, td *datadriven.TestData) string {
	for i := range td.CmdArgs {
		e.newPrimary(t, arg(t, td, i))
	}
	return ""
}

func (e *transcript) serveSnapshot(t *testing.T, td *datadriven.TestData) string {
	h := e.history(t, arg(t, td, 1))
	e.mu.Lock()
	snap := servedSnapshot{view: h.m.ref.Snapshot(), epoch: h.m.epoch}
	snap.commit = snap.view.AppliedLSN()
	td.MaybeScanArgs(t, "commit", &snap.commit)
	e.snapshots[arg(t, td, 0)] = snap
	e.mu.Unlock()
	return ""
}

func (e *transcript) restart(t *testing.T, td *datadriven.TestData) string {
	out := e.stop(t, td)
	e.start(t, td)
	return out
}

func (e *transcript) setAppliedMarker(t *testing.T, td *datadriven.TestData) string {
	if e.r != nil {
		t.Fatal("set-applied-marker: the replica is running")
	}
	m := datadir.AppliedMarker{LSN: uintArg(t, td, 0), Readable: td.HasArg("readable")}
	if err := datadir.SaveAppliedMarker(e.fs(), e.cfg.DataDir, m, true); err != nil {
		t.Fatal(err)
	}
	return ""
}

func (e *transcript) setVote(t *testing.T, td *datadriven.TestData) string {
	if e.r != nil {
		t.Fatal("set-vote: the replica is running")
	}
	if err := datadir.SaveVote(e.fs(), e.cfg.DataDir, datadir.Vote{Epoch: uintArg(t, td, 0)}); err != nil {
		t.Fatal(err)
	}
	return ""
}

func (e *transcript) failSnapshotSave(t *testing.T, _ *datadriven.TestData) string {
	if e.mem == nil {
		t.Fatal("fail-snapshot-save needs start fs=mem")
	}
	e.failSave.Store(true)
	return ""
}

func (e *transcript) injected(*testing.T, *datadriven.TestData) string {
	return fmt.Sprintf("snapshot saves failed: %d", e.saveFails.Load())
}

func (e *transcript) accept(t *testing.T, td *datadriven.TestData) string {
	p := arg(t, td, 0)
	s := e.primary(t, p).next(t)
	e.sessions[p] = s
	h := s.hello
	return fmt.Sprintf("hello epoch=%d next_lsn=%d fenced_epoch=%d history=%s", h.GetEpoch(), h.GetNextLsn(), h.GetFencedEpoch(), fmtHistory(h.GetHistory()))
}

func (e *transcript) heartbeat(t *testing.T, td *datadriven.TestData) string {
	var epoch, last uint64
	td.ScanArgs(t, "epoch", &epoch)
	td.ScanArgs(t, "last", &last)
	durable := last
	td.MaybeScanArgs(t, "durable", &durable)
	commit := durable
	td.MaybeScanArgs(t, "commit", &commit)
	var id, addr string
	td.MaybeScanArgs(t, "primary-id", &id)
	if td.HasArg("advertise") {
		// The primary's own address, as a primary advertises it.
		addr = e.primaries[arg(t, td, 0)].addr
	}
	e.streamSend(t, arg(t, td, 0), &walshipv1.StreamResponse{DurableLsn: durable, CommitLsn: commit, Msg: &walshipv1.StreamResponse_Heartbeat{Heartbeat: &walshipv1.Heartbeat{
		Epoch: epoch, LastLsn: last, TimeUnixNano: time.Now().UnixNano(), ReplyRequested: td.HasArg("reply"), PrimaryId: id, PrimaryAddr: addr,
	}}})
	return ""
}

func (e *transcript) end(t *testing.T, td *datadriven.TestData) string {
	var err error
	if td.HasArg("code") {
		var c string
		td.ScanArgs(t, "code", &c)
		msg := "ended by the test"
		td.MaybeScanArgs(t, "msg", &msg)
		err = status.Error(parseCode(t, c), msg)
	}
	e.session(t, arg(t, td, 0)).end <- err
	return ""
}

func (e *transcript) diverged(t *testing.T, td *datadriven.TestData) string {
	var keep, epoch, durable uint64
	td.ScanArgs(t, "keep", &keep)
	td.ScanArgs(t, "epoch", &epoch)
	td.MaybeScanArgs(t, "durable", &durable)
	e.session(t, arg(t, td, 0)).diverged(t, keep, epoch, durable)
	return ""
}

func (e *transcript) awaitEnd(t *testing.T, td *datadriven.TestData) string {
	ctx := e.session(t, arg(t, td, 0)).stream.Context()
	select {
	case <-ctx.Done():
		return fmt.Sprintf("stream over: %v", ctx.Err())
	case <-time.After(10 * time.Second):
		t.Fatal("the replica did not end the stream")
		return ""
	}
}

func (e *transcript) snapshotCalls(t *testing.T, td *datadriven.TestData) string {
	return fmt.Sprintf("snapshot calls: %d", e.primary(t, arg(t, td, 0)).snapshotCalls.Load())
}

func (e *transcript) status(t *testing.T, _ *datadriven.TestData) string {
	return fmtStatus(e.running(t).status(t))
}

func (e *transcript) waitApplied(t *testing.T, td *datadriven.TestData) string {
	r := e.running(t)
	r.waitApplied(t, uintArg(t, td, 0))
	return fmt.Sprintf("visible=%d", r.status(t).VisibleLsn)
}

func (e *transcript) waitVote(t *testing.T, td *datadriven.TestData) string {
	r := e.running(t)
	epoch := uintArg(t, td, 0)
	testkit.Until(t, fmt.Sprintf("a promise of epoch %d", epoch), func() bool { return r.status(t).VoteEpoch >= epoch })
	st := r.status(t)
	return fmt.Sprintf("vote=%d primary_id=%q primary=%s", st.VoteEpoch, st.PrimaryId, st.Primary)
}

func (e *transcript) metric(t *testing.T, td *datadriven.TestData) string {
	var labels []string
	for _, a := range td.CmdArgs[1:] {
		labels = append(labels, a.Key, a.SingleVal(t))
	}
	v, ok := gather(t, e.running(t).reg, arg(t, td, 0), labels...)
	if !ok {
		return "absent"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func (e *transcript) logstoreReads(t *testing.T, _ *datadriven.TestData) string {
	if e.ls == nil {
		t.Fatal("logstore-reads: no log store")
	}
	var out []string
	for len(e.ls.reads) > 0 {
		req := <-e.ls.reads
		out = append(out, fmt.Sprintf("read from_lsn=%d follow=%t", req.GetFromLsn(), req.GetFollow()))
	}
	if len(out) == 0 {
		return "no reads"
	}
	return strings.Join(out, "\n")
}

func (e *transcript) voteFile(*testing.T, *datadriven.TestData) string {
	v, err := datadir.LoadVote(e.fs(), e.cfg.DataDir)
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("epoch=%d primary_id=%q primary=%s", v.Epoch, v.Primary, v.Addr)
}

func (e *transcript) streamFromReplica(t *testing.T, _ *datadriven.TestData) string {
	st, err := walshipv1.NewReplicationServiceClient(e.running(t).conn).Stream(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	out := fmtErr(err)
	if v, _, ok := primaryFrom(err, e.running(t).s.Vote().Epoch); ok {
		out += fmt.Sprintf("\nnames primary_id=%q primary=%s epoch=%d", v.Primary, v.Addr, v.Epoch)
	}
	return out
}

// arg is the i-th argument, one given without a value.
func arg(t *testing.T, td *datadriven.TestData, i int) string {
	t.Helper()
	if i >= len(td.CmdArgs) || len(td.CmdArgs[i].Vals) != 0 {
		t.Fatalf("%s: %s needs a plain argument at position %d", td.Pos, td.Cmd, i+1)
	}
	return td.CmdArgs[i].Key
}

func uintArg(t *testing.T, td *datadriven.TestData, i int) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(arg(t, td, i), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", td.Pos, err)
	}
	return n
}

// lsnRange parses "A..B".
func lsnRange(t *testing.T, s string) (uint64, uint64) {
	t.Helper()
	a, b, ok := strings.Cut(s, "..")
	first, err1 := strconv.ParseUint(a, 10, 64)
	last, err2 := strconv.ParseUint(b, 10, 64)
	if !ok || err1 != nil || err2 != nil || first > last {
		t.Fatalf("%q is not an LSN range A..B", s)
	}
	return first, last
}

// maybeDuration parses argument key, if given, as a duration ("1s").
func maybeDuration(t *testing.T, td *datadriven.TestData, key string, d *time.Duration) bool {
	t.Helper()
	var s string
	if !td.MaybeScanArgs(t, key, &s) {
		return false
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s: %s: %v", td.Pos, key, err)
	}
	*d = v
	return true
}

func parseCode(t *testing.T, name string) codes.Code {
	t.Helper()
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c
		}
	}
	t.Fatalf("no gRPC code %q", name)
	return 0
}

func (e *transcript) fs() vfs.FS {
	if e.mem != nil {
		return e.mem
	}
	return vfs.OS
}

func (e *transcript) history(t *testing.T, name string) *history {
	t.Helper()
	h, ok := e.histories[name]
	if !ok {
		t.Fatalf("no history %q", name)
	}
	return h
}

func (e *transcript) primary(t *testing.T, name string) *fakePrimary {
	t.Helper()
	p, ok := e.primaries[name]
	if !ok {
		t.Fatalf("no primary %q (new-primary %s)", name, name)
	}
	return p
}

func (e *transcript) session(t *testing.T, name string) *session {
	t.Helper()
	s, ok := e.sessions[name]
	if !ok {
		t.Fatalf("no stream to %s accepted yet", name)
	}
	return s
}

func (e *transcript) running(t *testing.T) *running {
	t.Helper()
	if e.r == nil {
		t.Fatal("the replica is not running")
	}
	return e.r
}

// batch appends one transaction to a history, checking that it takes the
// LSNs the transcript says.
func (e *transcript) batch(t *testing.T, td *datadriven.TestData) string {
	name := arg(t, td, 0)
	h, ok := e.histories[name]
	if !ok {
		h = &history{m: newModel(t)}
		e.histories[name] = h
	}
	td.MaybeScanArgs(t, "epoch", &h.m.epoch)
	var r string
	td.ScanArgs(t, "lsns", &r)
	first, last := lsnRange(t, r)
	var ops []op
	for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "put":
			ops = append(ops, put(f[1], strings.Join(f[2:], " ")))
		case len(f) == 2 && f[0] == "del":
			ops = append(ops, del(f[1]))
		default:
			t.Fatalf("%s: %q is not \"put KEY VALUE\" or \"del KEY\"", td.Pos, line)
		}
	}
	if first != h.m.next || last != first+uint64(len(ops)) {
		t.Fatalf("%s: %d ops after LSN %d take LSNs %d..%d, not %s", td.Pos, len(ops), h.m.next-1, h.m.next, h.m.next+uint64(len(ops)), r)
	}
	h.batches = append(h.batches, h.m.txn(ops...))
	return ""
}

func (e *transcript) fork(t *testing.T, td *datadriven.TestData) string {
	var from string
	td.ScanArgs(t, "from", &from)
	src := e.history(t, from)
	at := src.m.next - 1
	td.MaybeScanArgs(t, "at", &at)
	h := &history{m: newModel(t)}
	h.m.epoch = src.m.epoch
	for _, b := range src.batches {
		if b.LastLsn <= at {
			h.m.apply(b)
			h.batches = append(h.batches, b)
			h.m.next = b.LastLsn + 1
		}
	}
	if h.m.next != at+1 {
		t.Fatalf("%s: LSN %d is not the end of a batch of %s", td.Pos, at, from)
	}
	e.histories[arg(t, td, 0)] = h
	return ""
}

// newPrimary starts a fake primary whose Snapshot serves what
// serve-snapshot set (UNIMPLEMENTED until then).
func (e *transcript) newPrimary(t *testing.T, name string) {
	fp := newFakePrimary(t)
	fp.snapshot = func(req *walshipv1.SnapshotRequest, st grpc.ServerStreamingServer[walshipv1.SnapshotResponse]) error {
		e.mu.Lock()
		snap, ok := e.snapshots[name]
		e.mu.Unlock()
		if !ok {
			return status.Errorf(codes.Unimplemented, "%s serves no snapshot", name)
		}
		return snapshotAt(snap.view, snap.epoch, snap.commit)(req, st)
	}
	e.primaries[name] = fp
	e.names = append(e.names, fp.addr, name)
}

func (e *transcript) logstore(t *testing.T, td *datadriven.TestData) string {
	if e.ls == nil {
		e.ls = newFakeLogStore(t, e.logstoreRead)
		e.names = append(e.names, e.ls.addr, "logstore")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var from string
	switch {
	case td.MaybeScanArgs(t, "serve", &from):
		e.lsMode, e.lsBatches = "serve", append([]*walshipv1.WalBatch(nil), e.history(t, from).batches...)
		e.lsFirst = 0
		td.MaybeScanArgs(t, "first", &e.lsFirst)
		if n := len(e.lsBatches); n > 0 {
			e.ls.mu.Lock()
			e.ls.durable.Store(max(e.ls.durable.Load(), e.lsBatches[n-1].LastLsn))
			e.ls.mu.Unlock()
		}
	case td.HasArg("out-of-range"):
		e.lsMode = "out-of-range"
	case td.HasArg("silent"):
		e.lsMode = "silent"
	}
	var epoch uint64
	if td.MaybeScanArgs(t, "vote-epoch", &epoch) {
		e.ls.voteEpoch.Store(epoch)
	}
	var primary string
	if td.MaybeScanArgs(t, "vote-primary", &primary) {
		// "id@pN": the primary its promise names, at fake primary pN's address.
		id, name, _ := strings.Cut(primary, "@")
		e.ls.mu.Lock()
		e.ls.votePrimary, e.ls.voteAddr = id, e.primaries[name].addr
		e.ls.mu.Unlock()
	}
	return ""
}

// logstoreSnapshot makes the log store hold a base snapshot of h as of
// now, of the epoch of h's newest batch.
func (e *transcript) logstoreSnapshot(t *testing.T, td *datadriven.TestData) string {
	if e.ls == nil {
		e.ls = newFakeLogStore(t, e.logstoreRead)
		e.names = append(e.names, e.ls.addr, "logstore")
	}
	h := e.history(t, arg(t, td, 0))
	v := h.m.ref.Snapshot()
	e.ls.mu.Lock()
	defer e.ls.mu.Unlock()
	e.ls.snap, e.ls.snapEpoch = v, h.batches[len(h.batches)-1].Epoch
	e.ls.durable.Store(max(e.ls.durable.Load(), v.AppliedLSN()))
	return ""
}

func (e *transcript) logstoreSnapshotCalls(t *testing.T, _ *datadriven.TestData) string {
	if e.ls == nil {
		t.Fatal("logstore-snapshot-calls: no log store")
	}
	return fmt.Sprintf("snapshot calls: %d", e.ls.snapCalls.Load())
}

func (e *transcript) logstoreRead(req *walshipv1.ReadRequest, st grpc.ServerStreamingServer[walshipv1.ReadResponse]) error {
	e.mu.Lock()
	mode, batches, first := e.lsMode, e.lsBatches, e.lsFirst
	e.mu.Unlock()
	if mode == "serve" && req.GetFromLsn() < first {
		mode = "out-of-range"
	}
	switch mode {
	case "out-of-range":
		return status.Errorf(codes.OutOfRange, "LSN %d is no longer kept", req.GetFromLsn())
	case "silent":
		<-st.Context().Done()
		return st.Context().Err()
	}
	for _, b := range batches {
		if b.LastLsn >= req.GetFromLsn() {
			if err := st.Send(&walshipv1.ReadResponse{Batch: b}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (e *transcript) start(t *testing.T, td *datadriven.TestData) string {
	if e.r != nil {
		t.Fatal("start: the replica is running")
	}
	if !e.started {
		var p string
		td.ScanArgs(t, "primary", &p)
		var fs string
		td.MaybeScanArgs(t, "fs", &fs)
		dir := t.TempDir()
		if fs == "mem" {
			e.mem, dir = vfs.NewMem(), "/data"
			e.mem.InjectError(func(op vfs.Op, name string) error {
				if e.crashed.Load() && op != vfs.OpRead && op != vfs.OpStat && op != vfs.OpReadDir && op != vfs.OpClose {
					return vfs.ErrInjected
				}
				if op == vfs.OpRename && strings.HasSuffix(name, ".snap.tmp") && e.failSave.CompareAndSwap(true, false) {
					e.saveFails.Add(1)
					return vfs.ErrInjected
				}
				return nil
			})
		}
		e.cfg = testConfig(t, dir, e.primary(t, p).addr)
		if e.mem != nil {
			e.cfg.FS = e.mem
		}
		if e.ls != nil {
			e.cfg.LogStores = []string{e.ls.addr}
		}
		maybeDuration(t, td, "heartbeat", &e.cfg.HeartbeatInterval)
		maybeDuration(t, td, "flush-delay", &e.cfg.FlushDelay)
		e.started = true
	}
	e.r = start(t, e.cfg)
	// Status reports no rung until the follower has begun: wait for it,
	// so that a status printed now is the same every time.
	testkit.Until(t, "the follower to start", func() bool {
		return e.r.status(t).Rung != walshipv1.CatchUpRung_CATCH_UP_RUNG_UNSPECIFIED
	})
	return ""
}

func (e *transcript) stop(t *testing.T, _ *datadriven.TestData) string {
	err := e.running(t).stop(t)
	e.r = nil
	if err != nil {
		return "stopped: " + err.Error()
	}
	return "stopped"
}

// crash stops the replica as a machine crash would: the disk first stops
// taking anything (so that Run's clean stop saves nothing), then loses
// what was not synced.
func (e *transcript) crash(t *testing.T, _ *datadriven.TestData) string {
	if e.mem == nil {
		t.Fatal("crash needs start fs=mem")
	}
	e.crashed.Store(true)
	e.mem.Crash()
	_ = e.running(t).stop(t) // fails in ways of no interest: the disk is gone
	e.r = nil
	e.crashed.Store(false)
	return "crashed"
}

// streamSend sends m on p's stream.
func (e *transcript) streamSend(t *testing.T, p string, m *walshipv1.StreamResponse) {
	t.Helper()
	if err := e.session(t, p).stream.Send(m); err != nil {
		t.Fatalf("send to the replica on %s's stream: %v", p, err)
	}
}

func (e *transcript) send(t *testing.T, td *datadriven.TestData) string {
	p, h := arg(t, td, 0), e.history(t, arg(t, td, 1))
	first, last := lsnRange(t, arg(t, td, 2))
	var durable *uint64
	var d uint64
	if td.MaybeScanArgs(t, "durable", &d) {
		durable = &d
	}
	var commit *uint64
	var c uint64
	if td.MaybeScanArgs(t, "commit", &c) {
		commit = &c
	}
	var replyAt []walshipv1.SyncLevel
	if a, ok := td.Arg("reply-at"); ok {
		for _, l := range a.Vals {
			v, ok := walshipv1.SyncLevel_value["SYNC_LEVEL_"+strings.ToUpper(l)]
			if !ok {
				t.Fatalf("%s: no sync level %q", td.Pos, l)
			}
			replyAt = append(replyAt, walshipv1.SyncLevel(v))
		}
	}
	next := first
	for _, b := range h.batches {
		if b.FirstLsn < first || b.LastLsn > last {
			continue
		}
		if b.FirstLsn != next {
			break
		}
		m := &walshipv1.StreamResponse{DurableLsn: b.LastLsn, CommitLsn: b.LastLsn, ReplyAt: replyAt, Msg: &walshipv1.StreamResponse_Batch{Batch: b}}
		if durable != nil {
			m.DurableLsn = *durable
		}
		if commit != nil {
			m.CommitLsn = *commit
		}
		e.streamSend(t, p, m)
		next = b.LastLsn + 1
	}
	if next != last+1 {
		t.Fatalf("%s: the history's batches do not cover LSNs %d..%d (stopped at %d)", td.Pos, first, last, next)
	}
	return ""
}

// ackCond is one condition on an ack: field op lsn.
type ackCond struct {
	field, op string
	lsn       uint64
}

var ackCondPattern = regexp.MustCompile(`^(written|flushed|applied)(>=|<=|=|<|>)(\d+)$`)

func parseAckCond(t *testing.T, s string) ackCond {
	t.Helper()
	m := ackCondPattern.FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("%q is not an ack condition like flushed>=8", s)
	}
	n, _ := strconv.ParseUint(m[3], 10, 64)
	return ackCond{field: m[1], op: m[2], lsn: n}
}

func (c ackCond) holds(a *walshipv1.ReplicaAck) bool {
	v := map[string]uint64{"written": a.WrittenLsn, "flushed": a.FlushedLsn, "applied": a.AppliedLsn}[c.field]
	switch c.op {
	case ">=":
		return v >= c.lsn
	case "<=":
		return v <= c.lsn
	case "=":
		return v == c.lsn
	case "<":
		return v < c.lsn
	default:
		return v > c.lsn
	}
}

func allHold(cs []ackCond, a *walshipv1.ReplicaAck) bool {
	for _, c := range cs {
		if !c.holds(a) {
			return false
		}
	}
	return len(cs) > 0
}

func fmtAck(a *walshipv1.ReplicaAck) string {
	return fmt.Sprintf("ack written=%d flushed=%d applied=%d", a.WrittenLsn, a.FlushedLsn, a.AppliedLsn)
}

// awaitAck reads acks until one meets every condition; it prints that one
// and any read on the way (that one included) that met every forbid
// condition.
func (e *transcript) awaitAck(t *testing.T, td *datadriven.TestData) string {
	s := e.session(t, arg(t, td, 0))
	var want, forbid []ackCond
	for _, a := range td.CmdArgs[1:] {
		switch {
		case a.Key == "forbid":
			for _, v := range a.Vals {
				forbid = append(forbid, parseAckCond(t, v))
			}
		case len(a.Vals) == 0:
			want = append(want, parseAckCond(t, a.Key))
		default:
			want = append(want, parseAckCond(t, a.Key+"="+a.Vals[0]))
		}
	}
	var forbidden []string
	deadline := time.After(10 * time.Second)
	for {
		select {
		case a := <-s.acks:
			if allHold(forbid, a) {
				forbidden = append(forbidden, "forbidden "+fmtAck(a))
			}
			if allHold(want, a) {
				return strings.Join(append([]string{fmtAck(a)}, forbidden...), "\n")
			}
		case <-deadline:
			t.Fatalf("%s: no such ack within 10s", td.Pos)
		}
	}
}

func fmtHistory(h []*walshipv1.EpochStart) string {
	if len(h) == 0 {
		return "none"
	}
	var parts []string
	for _, s := range h {
		parts = append(parts, fmt.Sprintf("%d@%d", s.GetEpoch(), s.GetFirstLsn()))
	}
	return strings.Join(parts, ",")
}

func fmtStatus(st *walshipv1.StatusResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "epoch=%d vote=%d primary_id=%q primary=%s history=%s\n", st.Epoch, st.VoteEpoch, st.PrimaryId, st.Primary, fmtHistory(st.History))
	fmt.Fprintf(&b, "last=%d durable=%d visible=%d snapshot=%d wal_first=%d keys=%d\n", st.LastLsn, st.DurableLsn, st.VisibleLsn, st.SnapshotLsn, st.WalFirstLsn, st.Keys)
	fmt.Fprintf(&b, "rung=%s serving=%t", rungLabel(st.Rung), st.Serving)
	for _, o := range st.Orphans {
		fmt.Fprintf(&b, "\norphan epoch=%d lsns=%d..%d", o.Epoch, o.FirstLsn, o.LastLsn)
	}
	return b.String()
}

func fmtErr(err error) string {
	if err == nil {
		return "ok"
	}
	s := status.Convert(err)
	return fmt.Sprintf("error %v: %s", s.Code(), s.Message())
}

// state prints every pair the replica serves, after checking that they make
// the state digest its Status reports.
func (e *transcript) state(t *testing.T, _ *datadriven.TestData) string {
	r := e.running(t)
	scan, err := r.kv.Scan(tctx(t), &walshipv1.ScanRequest{})
	if err != nil {
		return fmtErr(err)
	}
	st := r.status(t)
	var b strings.Builder
	fmt.Fprintf(&b, "visible=%d", scan.AppliedLsn)
	bld := state.NewBuilder(scan.AppliedLsn)
	for _, kv := range scan.Kvs {
		fmt.Fprintf(&b, "\n%s=%s@%d", kv.Key, kv.Value, kv.VersionLsn)
		if err := bld.Add([]byte(kv.Key), kv.Value, kv.VersionLsn); err != nil {
			fmt.Fprintf(&b, " (%v)", err)
		}
	}
	if st.VisibleLsn != scan.AppliedLsn {
		fmt.Fprintf(&b, "\nStatus is at LSN %d", st.VisibleLsn)
	}
	if _, err := bld.Finish(st.Keys, st.StateDigest); err != nil {
		fmt.Fprintf(&b, "\nnot the Status digest: %v", err)
	}
	return b.String()
}

func (e *transcript) get(t *testing.T, td *datadriven.TestData) string {
	req := &walshipv1.GetRequest{Key: arg(t, td, 0)}
	td.MaybeScanArgs(t, "min-lsn", &req.MinLsn)
	var wait time.Duration
	if maybeDuration(t, td, "wait", &wait) {
		req.WaitTimeout = durationpb.New(wait)
	}
	got, err := e.running(t).kv.Get(tctx(t), req)
	if err != nil {
		return fmtErr(err)
	}
	if !got.Found {
		return fmt.Sprintf("not found applied=%d", got.AppliedLsn)
	}
	return fmt.Sprintf("%s@%d applied=%d", got.Value, got.VersionLsn, got.AppliedLsn)
}

func (e *transcript) watch(t *testing.T, td *datadriven.TestData) string {
	req := &walshipv1.WatchRequest{}
	td.MaybeScanArgs(t, "from", &req.StartLsn)
	var wait time.Duration
	if maybeDuration(t, td, "wait", &wait) {
		req.WaitTimeout = durationpb.New(wait)
	}
	ctx, cancel := context.WithCancel(tctx(t))
	defer cancel()
	stream, err := e.running(t).kv.Watch(ctx, req)
	if err != nil {
		return fmtErr(err)
	}
	m, err := stream.Recv()
	if err != nil {
		return fmtErr(err)
	}
	var b strings.Builder
	if p := m.GetProgress(); p != nil {
		fmt.Fprintf(&b, "progress lsn=%d", p.GetLsn())
	}
	for _, tx := range m.GetTxns().GetTxns() {
		fmt.Fprintf(&b, "txn lsn=%d", tx.GetLsn())
		for _, ev := range tx.GetEvents() {
			fmt.Fprintf(&b, " %s %s=%s", strings.TrimPrefix(ev.GetType().String(), "WATCH_EVENT_TYPE_"), ev.GetKey(), ev.GetValue())
		}
		b.WriteString("\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func (e *transcript) fence(t *testing.T, td *datadriven.TestData) string {
	req := &walshipv1.FenceRequest{}
	td.ScanArgs(t, "epoch", &req.Epoch)
	td.ScanArgs(t, "candidate", &req.CandidateId)
	var addr string
	if td.MaybeScanArgs(t, "addr", &addr) {
		req.CandidateAddr = addr
		if p, ok := e.primaries[addr]; ok {
			req.CandidateAddr = p.addr
		}
	}
	resp, err := walshipv1.NewEpochServiceClient(e.running(t).conn).Fence(tctx(t), req)
	if err != nil {
		return fmtErr(err)
	}
	return fmt.Sprintf("granted=%t epoch=%d primary_id=%q primary=%s\nid=%s last_epoch=%d last_lsn=%d applied=%d history=%s",
		resp.Granted, resp.Epoch, resp.PrimaryId, resp.PrimaryAddr, resp.Id, resp.LastEpoch, resp.LastLsn, resp.AppliedLsn, fmtHistory(resp.History))
}

func (e *transcript) readLog(t *testing.T, td *datadriven.TestData) string {
	req := &walshipv1.ReadRequest{}
	td.ScanArgs(t, "from", &req.FromLsn)
	td.ScanArgs(t, "to", &req.ToLsn)
	rd, err := walshipv1.NewLogStoreServiceClient(e.running(t).conn).Read(tctx(t), req)
	if err != nil {
		return fmtErr(err)
	}
	var out []string
	for {
		m, err := rd.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			out = append(out, fmtErr(err))
			break
		}
		b := m.GetBatch()
		out = append(out, fmt.Sprintf("batch %d..%d epoch=%d", b.GetFirstLsn(), b.GetLastLsn(), b.GetEpoch()))
	}
	if len(out) == 0 {
		return "no batches"
	}
	return strings.Join(out, "\n")
}
