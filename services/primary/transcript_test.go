package primary

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestTranscripts runs the scenarios in testdata/*.txt from the primary's
// side, as services/replica's transcripts do from the replica's: a real
// primary (in-process, on an in-memory filesystem so that a crash loses
// what was not synced) driven by scripted fake replicas — real
// ReplicationService.Stream clients — and a scripted client. Each command
// prints what it observed, never its input, and nothing that depends on
// timing: heartbeats are skipped, and every wait is on a condition with a
// deadline. `go test ./services/primary/ -run TestTranscripts -rewrite`
// regenerates the expected output; read the diff before committing it.
//
// Commands (arguments in brackets are optional):
//
// The primary:
//
//	start [cluster=ID] [logstores=a,b]
//	                                start it, as p1 (cluster: its saved
//	                                cluster id, written before the first
//	                                start; default none, so it makes one)
//	stop                            stop it gracefully; prints what Run returned
//	crash                           the machine dies: nothing more reaches
//	                                the disk, what was not synced is lost, a
//	                                held fsync fails; once the background
//	                                Puts are answered, the primary is stopped
//	restart                         start it again on what the disk kept
//	await-exit                      wait for Run to return by itself; print
//	                                what it returned
//	hold-fsync                      the next fsyncs of the WAL wait
//	release-fsync                   they go on, and later ones do not wait
//	status                          epoch, last and durable LSNs
//	history                         the epoch history as saved (epoch@first LSN)
//	vote                            the vote as saved: its epoch and primary
//	metric <name>                   a counter or gauge of the primary's registry
//
// Fake log stores (scriptedLogStore; their addresses print as their names):
//
//	logstore <name> [hold] [cluster=ID]
//	                                a log store, to be given to start
//	                                (logstores=a,b), of cluster ID (default:
//	                                the first it is fenced with); it refuses
//	                                another cluster's fences, grants newer ones,
//	                                echoes heartbeats at once, and acknowledges
//	                                batches as durable at once (hold: only
//	                                when logstore-ack says)
//	logstore-recv <name> [lsn=N]    wait until it has received LSN N; print
//	                                the fences, cuts and batches it was sent
//	                                since the last time
//	logstore-ack <name> durable=N   the held log store's log is durable to N
//	logstore-promise <name> epoch=E [primary=ID]
//	                                it has promised epoch E to ID (default
//	                                n2): it refuses heartbeats of older ones
//	await-logstore-wait             wait until a commit waits on the log stores
//
// A client:
//
//	put key=K value=V [durability=async] [sync=flush|write|apply]
//	    [logstore=sync] [as=NAME]   a Put (sync: wait for one replica at that
//	                                level; logstore: for a majority of the
//	                                log stores); prints "lsn N" or the error's
//	                                code and message; with as, it runs in the
//	                                background and prints nothing
//	await-put NAME                  wait for the background Put, print its
//	                                result (an error as its code only)
//	peek-put NAME                   "no answer yet", or its answer: no wait
//
// A fake replica (id: its replica_id, and the name of its stream):
//
//	stream id=R next=N epoch=E [fenced=E] [cluster=ID]
//	                                open a stream and send the hello
//	recv id=R                       the next message that is not a
//	                                heartbeat: "batch F..L epoch E durable D",
//	                                "diverged at K epoch E", the error that
//	                                ended the stream, or "end"
//	recv-durable id=R lsn=N         read until the durable LSN reaches N;
//	                                prints the batches read on the way (LSN
//	                                ranges and epochs, not the durable LSN
//	                                each carried: when the fsync lands
//	                                relative to the shipping is a race) and
//	                                the durable LSN reached
//	ack id=R written=W flushed=F applied=A
//	close id=R                      end the stream from the replica's side
//	await-replica-wait level=L      wait until a commit waits on the replicas
//	                                at level L (write, flush or apply)
//	await-replica id=R [written=W] [flushed=F] [applied=A]
//	                                wait until the primary has recorded R's
//	                                positions at least there; print them and
//	                                how many sync commits wait on replicas at
//	                                each level
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		e := &transcript{streams: map[string]*fakeReplica{}, puts: map[string]chan putResult{},
			logstores: map[string]*scriptedLogStore{}}
		datadriven.RunTest(t, path, e.run)
	})
}

// transcript is one scenario's world: the primary, its disk and the fakes
// talking to it.
type transcript struct {
	cfg     Config
	mem     *vfs.MemFS
	reg     *prometheus.Registry
	r       *running // nil while stopped
	streams map[string]*fakeReplica
	puts    map[string]chan putResult // background Puts by name
	gate    *fsyncGate                // non-nil while fsyncs of the WAL are held

	logstores     map[string]*scriptedLogStore // by name
	logstoreNames []string
}

// putResult is a background Put's answer.
type putResult struct {
	lsn uint64
	err error
}

// fsyncGate holds the WAL's fsyncs until it opens: they then succeed, or
// fail if the machine went down first.
type fsyncGate struct {
	open chan struct{}
	down atomic.Bool
}

// fakeReplica is a scripted replica's stream.
type fakeReplica struct {
	s      walshipv1.ReplicationService_StreamClient
	cancel context.CancelFunc
}

// tcommand is a command: how many plain arguments it takes first, the
// names of the others, and what it does.
type tcommand struct {
	plain int
	args  []string
	run   func(e *transcript, t *testing.T, td *datadriven.TestData) string
}

// transcriptCommands are the commands TestTranscripts lists.
var transcriptCommands = map[string]tcommand{
	"start":               {0, []string{"cluster", "logstores"}, (*transcript).start},
	"stop":                {0, nil, (*transcript).stop},
	"crash":               {0, nil, (*transcript).crash},
	"restart":             {0, nil, (*transcript).restart},
	"hold-fsync":          {0, nil, (*transcript).holdFsync},
	"release-fsync":       {0, nil, (*transcript).releaseFsync},
	"status":              {0, nil, (*transcript).status},
	"history":             {0, nil, (*transcript).history},
	"vote":                {0, nil, (*transcript).voteFile},
	"metric":              {1, nil, (*transcript).metric},
	"put":                 {0, []string{"key", "value", "durability", "sync", "logstore", "as"}, (*transcript).put},
	"await-put":           {1, nil, (*transcript).awaitPut},
	"peek-put":            {1, nil, (*transcript).peekPut},
	"stream":              {0, []string{"id", "next", "epoch", "fenced", "cluster"}, (*transcript).stream},
	"recv":                {0, []string{"id"}, (*transcript).recv},
	"recv-durable":        {0, []string{"id", "lsn"}, (*transcript).recvDurable},
	"ack":                 {0, []string{"id", "written", "flushed", "applied"}, (*transcript).ack},
	"close":               {0, []string{"id"}, (*transcript).closeStream},
	"await-replica":       {0, []string{"id", "written", "flushed", "applied"}, (*transcript).awaitReplica},
	"await-replica-wait":  {0, []string{"level"}, (*transcript).awaitReplicaWait},
	"logstore":            {1, []string{"hold", "cluster"}, (*transcript).logstore},
	"logstore-recv":       {1, []string{"lsn"}, (*transcript).logstoreRecv},
	"logstore-promise":    {1, []string{"epoch", "primary"}, (*transcript).logstorePromise},
	"await-exit":          {0, nil, (*transcript).awaitExit},
	"logstore-ack":        {1, []string{"durable"}, (*transcript).logstoreAck},
	"await-logstore-wait": {0, nil, (*transcript).awaitLogStoreWait},
}

// run runs one command, checking its arguments first: a typo must not
// leave a transcript testing less than it says.
func (e *transcript) run(t *testing.T, td *datadriven.TestData) string {
	c, ok := transcriptCommands[td.Cmd]
	if !ok {
		td.Fatalf(t, "unknown command %q", td.Cmd)
	}
	for i, a := range td.CmdArgs {
		if i < c.plain {
			if len(a.Vals) > 0 {
				td.Fatalf(t, "%s: argument %d must be plain, not %s", td.Cmd, i+1, a.String())
			}
		} else if !slices.Contains(c.args, a.Key) {
			td.Fatalf(t, "%s does not take %s", td.Cmd, a.String())
		}
	}
	if len(td.CmdArgs) < c.plain {
		td.Fatalf(t, "%s takes %d plain arguments first", td.Cmd, c.plain)
	}
	out := c.run(e, t, td)
	// The fake log stores' addresses print as their names.
	for _, name := range e.logstoreNames {
		out = strings.ReplaceAll(out, e.logstores[name].addr, name)
	}
	return out
}

func (e *transcript) start(t *testing.T, td *datadriven.TestData) string {
	if e.mem != nil {
		td.Fatalf(t, "start: already started once; use restart")
	}
	e.mem = vfs.NewMem()
	e.cfg = testConfig(t, "/data")
	e.cfg.FS = e.mem
	e.cfg.ID = "p1"
	if td.HasArg("logstores") {
		for _, a := range td.CmdArgs {
			if a.Key != "logstores" {
				continue
			}
			for _, name := range strings.Split(strings.Join(a.Vals, ","), ",") {
				l, ok := e.logstores[name]
				if !ok {
					td.Fatalf(t, "start: no log store %s", name)
				}
				e.cfg.LogStores = append(e.cfg.LogStores, l.addr)
			}
		}
	}
	// Async commits stay unsynced until a sync commit syncs them: the
	// transcript decides when.
	e.cfg.AsyncFlushInterval = time.Minute
	if td.HasArg("cluster") {
		var id string
		td.ScanArgs(t, "cluster", &id)
		if err := e.mem.MkdirAll(e.cfg.DataDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := datadir.SaveCluster(e.mem, e.cfg.DataDir, id); err != nil {
			t.Fatal(err)
		}
	}
	e.launch(t)
	return ""
}

// launch starts the primary on e.cfg with a registry of its own.
func (e *transcript) launch(t *testing.T) {
	if e.r != nil {
		t.Fatal("the primary is running")
	}
	e.reg = prometheus.NewRegistry()
	e.cfg.Registry = e.reg
	e.r = start(t, e.cfg)
	// Registered after start's own cleanup, so run before it: a held
	// fsync must let go before the primary can stop.
	t.Cleanup(e.cleanup)
}

func (e *transcript) stop(t *testing.T, _ *datadriven.TestData) string {
	r := e.running(t)
	e.r = nil
	if err := r.stop(t); err != nil {
		return fmt.Sprintf("stopped: %v", err)
	}
	return "stopped"
}

func (e *transcript) awaitExit(t *testing.T, _ *datadriven.TestData) string {
	r := e.running(t)
	e.r = nil
	return fmt.Sprintf("Run returned: %v", r.failed(t, "await-exit"))
}

func (e *transcript) crash(t *testing.T, _ *datadriven.TestData) string {
	r := e.running(t)
	e.r = nil
	e.mem.Crash()
	e.mem.InjectError(func(vfs.Op, string) error { return errors.New("machine is down") })
	if e.gate != nil {
		e.gate.down.Store(true) // a held fsync returns "machine is down"
		close(e.gate.open)
		e.gate = nil
	}
	// The failed fsync is fatal to the log: every commit waiting on it is
	// answered before the primary stops (after, the client would see only
	// its connection close).
	for name, res := range e.puts {
		select {
		case p := <-res:
			res <- p // for await-put
		case <-time.After(20 * time.Second):
			t.Fatalf("crash: the put %s was not answered", name)
		}
	}
	_ = r.stop(t) // whatever it says, it said it to a dead machine
	e.mem.InjectError(nil)
	e.mem.InjectSyncError(nil)
	return ""
}

func (e *transcript) restart(t *testing.T, _ *datadriven.TestData) string {
	e.launch(t)
	return ""
}

func (e *transcript) holdFsync(t *testing.T, td *datadriven.TestData) string {
	if e.gate != nil {
		td.Fatalf(t, "hold-fsync: already held")
	}
	gate := &fsyncGate{open: make(chan struct{})}
	e.gate = gate
	e.mem.InjectSyncError(func(name string) error {
		if filepath.Ext(name) != ".wal" {
			return nil
		}
		<-gate.open
		if gate.down.Load() {
			return errors.New("machine is down")
		}
		return nil
	})
	return ""
}

func (e *transcript) releaseFsync(t *testing.T, td *datadriven.TestData) string {
	if e.gate == nil {
		td.Fatalf(t, "release-fsync: nothing held")
	}
	e.mem.InjectSyncError(nil)
	close(e.gate.open)
	e.gate = nil
	return ""
}

func (e *transcript) status(t *testing.T, _ *datadriven.TestData) string {
	st, err := e.running(t).admin.Status(ctx(t), &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("epoch=%d last=%d durable=%d", st.Epoch, st.LastLsn, st.DurableLsn)
}

func (e *transcript) history(t *testing.T, _ *datadriven.TestData) string {
	h, err := datadir.LoadHistory(e.mem, e.cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, x := range h {
		out = append(out, fmt.Sprintf("%d@%d", x.Epoch, x.FirstLSN))
	}
	return strings.Join(out, ",")
}

func (e *transcript) voteFile(t *testing.T, _ *datadriven.TestData) string {
	v, err := datadir.LoadVote(e.mem, e.cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("epoch=%d primary=%q", v.Epoch, v.Primary)
}

func (e *transcript) metric(t *testing.T, td *datadriven.TestData) string {
	e.running(t)
	name := td.CmdArgs[0].Key
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		return strconv.FormatFloat(sum, 'g', -1, 64)
	}
	return "absent"
}

func (e *transcript) put(t *testing.T, td *datadriven.TestData) string {
	r := e.running(t)
	var key, value string
	td.ScanArgs(t, "key", &key)
	td.ScanArgs(t, "value", &value)
	req := &walshipv1.PutRequest{Key: key, Value: []byte(value)}
	policy := &walshipv1.CommitPolicy{}
	if td.HasArg("durability") {
		var d string
		td.ScanArgs(t, "durability", &d)
		if d != "async" {
			td.Fatalf(t, "put: durability=%s; only async", d)
		}
		policy.Durability = walshipv1.Durability_DURABILITY_ASYNC
	}
	if td.HasArg("logstore") {
		var mode string
		td.ScanArgs(t, "logstore", &mode)
		if mode != "sync" {
			td.Fatalf(t, "put: logstore=%s; only sync", mode)
		}
		policy.Logstore = walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC
	}
	if td.HasArg("sync") {
		var lvl string
		td.ScanArgs(t, "sync", &lvl)
		level, ok := walshipv1.SyncLevel_value["SYNC_LEVEL_"+strings.ToUpper(lvl)]
		if !ok {
			td.Fatalf(t, "put: sync=%s", lvl)
		}
		policy.Replication, policy.SyncReplicas = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, 1
		policy.SyncLevel, policy.SyncTimeout = walshipv1.SyncLevel(level), durationpb.New(10*time.Second)
	}
	if td.HasArg("durability") || td.HasArg("logstore") || td.HasArg("sync") {
		req.Policy = policy
	}
	c := ctx(t)
	if !td.HasArg("as") {
		resp, err := r.kv.Put(c, req)
		if err != nil {
			st := status.Convert(err)
			return fmt.Sprintf("error %v: %s", st.Code(), st.Message())
		}
		return fmt.Sprintf("lsn %d", resp.Lsn)
	}
	var name string
	td.ScanArgs(t, "as", &name)
	if _, dup := e.puts[name]; dup {
		td.Fatalf(t, "put: %s is already a name", name)
	}
	res := make(chan putResult, 1)
	e.puts[name] = res
	go func() {
		resp, err := r.kv.Put(c, req)
		res <- putResult{resp.GetLsn(), err}
	}()
	return ""
}

func (e *transcript) awaitPut(t *testing.T, td *datadriven.TestData) string {
	name := td.CmdArgs[0].Key
	res, ok := e.puts[name]
	if !ok {
		td.Fatalf(t, "await-put: no put named %s", name)
	}
	select {
	case p := <-res:
		delete(e.puts, name)
		if p.err != nil {
			return fmt.Sprintf("error %v", status.Code(p.err))
		}
		return fmt.Sprintf("lsn %d", p.lsn)
	case <-time.After(20 * time.Second):
		td.Fatalf(t, "await-put: %s did not return", name)
		return ""
	}
}

// peekPut prints whether the background Put has been answered yet,
// without waiting: "no answer yet" is only ever printed truthfully, so a
// transcript may say it where the Put cannot have been answered (its
// fsync held); a premature answer shows there, at least sometimes.
func (e *transcript) peekPut(t *testing.T, td *datadriven.TestData) string {
	name := td.CmdArgs[0].Key
	res, ok := e.puts[name]
	if !ok {
		td.Fatalf(t, "peek-put: no put named %s", name)
	}
	select {
	case p := <-res:
		res <- p // for await-put
		return fmt.Sprintf("answered: lsn %d, %v", p.lsn, p.err)
	default:
		return "no answer yet"
	}
}

func (e *transcript) stream(t *testing.T, td *datadriven.TestData) string {
	r := e.running(t)
	var id string
	var next, epoch, fenced uint64
	td.ScanArgs(t, "id", &id)
	td.ScanArgs(t, "next", &next)
	td.ScanArgs(t, "epoch", &epoch)
	td.MaybeScanArgs(t, "fenced", &fenced)
	var cluster string
	td.MaybeScanArgs(t, "cluster", &cluster)
	if old := e.streams[id]; old != nil {
		old.cancel()
	}
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	s, err := walshipv1.NewReplicationServiceClient(r.conn).Stream(c)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	e.streams[id] = &fakeReplica{s: s, cancel: cancel}
	hello := &walshipv1.ReplicaHello{ReplicaId: id, NextLsn: next, Epoch: epoch, FencedEpoch: fenced, ClusterId: cluster}
	if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: hello}}); err != nil {
		t.Fatal(err)
	}
	return ""
}

// next is the replica's next message that is not a heartbeat, or the
// stream's end printed.
func (e *transcript) next(t *testing.T, td *datadriven.TestData) (*walshipv1.StreamResponse, string) {
	s := e.replica(t, td)
	for {
		m, err := s.s.Recv()
		switch {
		case errors.Is(err, io.EOF):
			return nil, "end"
		case err != nil:
			st := status.Convert(err)
			return nil, fmt.Sprintf("error %v: %s", st.Code(), st.Message())
		case m.GetHeartbeat() == nil:
			return m, ""
		}
	}
}

func (e *transcript) recv(t *testing.T, td *datadriven.TestData) string {
	m, end := e.next(t, td)
	if m == nil {
		return end
	}
	return fmtStreamResponse(m)
}

func fmtStreamResponse(m *walshipv1.StreamResponse) string {
	switch {
	case m.GetBatch() != nil:
		b := m.GetBatch()
		return fmt.Sprintf("batch %d..%d epoch %d durable %d", b.FirstLsn, b.LastLsn, b.Epoch, m.DurableLsn)
	case m.GetDiverged() != nil:
		d := m.GetDiverged()
		return fmt.Sprintf("diverged at %d epoch %d", d.TruncateAfterLsn, d.Epoch)
	}
	return fmt.Sprintf("unexpected %v", m)
}

func (e *transcript) recvDurable(t *testing.T, td *datadriven.TestData) string {
	var lsn uint64
	td.ScanArgs(t, "lsn", &lsn)
	s := e.replica(t, td)
	var out []string
	for {
		m, err := s.s.Recv()
		if err != nil {
			st := status.Convert(err)
			return strings.Join(append(out, fmt.Sprintf("error %v: %s", st.Code(), st.Message())), "\n")
		}
		switch {
		case m.GetBatch() != nil:
			b := m.GetBatch()
			out = append(out, fmt.Sprintf("batch %d..%d epoch %d", b.FirstLsn, b.LastLsn, b.Epoch))
		case m.GetDiverged() != nil:
			out = append(out, fmtStreamResponse(m))
		}
		if m.DurableLsn >= lsn {
			return strings.Join(append(out, fmt.Sprintf("durable %d", m.DurableLsn)), "\n")
		}
	}
}

func (e *transcript) ack(t *testing.T, td *datadriven.TestData) string {
	var a walshipv1.ReplicaAck
	td.MaybeScanArgs(t, "written", &a.WrittenLsn)
	td.MaybeScanArgs(t, "flushed", &a.FlushedLsn)
	td.MaybeScanArgs(t, "applied", &a.AppliedLsn)
	if err := e.replica(t, td).s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: &a}}); err != nil {
		t.Fatal(err)
	}
	return ""
}

func (e *transcript) awaitReplica(t *testing.T, td *datadriven.TestData) string {
	r := e.running(t)
	var id string
	var want replicaPos
	td.ScanArgs(t, "id", &id)
	td.MaybeScanArgs(t, "written", &want.written)
	td.MaybeScanArgs(t, "flushed", &want.flushed)
	td.MaybeScanArgs(t, "applied", &want.applied)
	var got replicaPos
	testkit.Until(t, fmt.Sprintf("the primary to record %s's ack", id), func() bool {
		rs, _ := r.s.peers.snapshot()
		for _, p := range rs {
			if p.id == id {
				got = p
				return p.written >= want.written && p.flushed >= want.flushed && p.applied >= want.applied
			}
		}
		return false
	})
	w := &r.s.peers.waiting
	return fmt.Sprintf("%s written=%d flushed=%d applied=%d\nwaiting write=%d flush=%d apply=%d", id, got.written, got.flushed, got.applied,
		w[walshipv1.SyncLevel_SYNC_LEVEL_WRITE].Load(), w[walshipv1.SyncLevel_SYNC_LEVEL_FLUSH].Load(), w[walshipv1.SyncLevel_SYNC_LEVEL_APPLY].Load())
}

func (e *transcript) awaitReplicaWait(t *testing.T, td *datadriven.TestData) string {
	r := e.running(t)
	var lvl string
	td.ScanArgs(t, "level", &lvl)
	level, ok := walshipv1.SyncLevel_value["SYNC_LEVEL_"+strings.ToUpper(lvl)]
	if !ok {
		td.Fatalf(t, "await-replica-wait: level=%s", lvl)
	}
	w := &r.s.peers.waiting[level]
	testkit.Until(t, "a commit to wait on the replicas at "+lvl, func() bool { return w.Load() > 0 })
	return fmt.Sprintf("waiting: %d", w.Load())
}

func (e *transcript) closeStream(t *testing.T, td *datadriven.TestData) string {
	s := e.replica(t, td)
	if err := s.s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	return ""
}

func (e *transcript) replica(t *testing.T, td *datadriven.TestData) *fakeReplica {
	var id string
	td.ScanArgs(t, "id", &id)
	s, ok := e.streams[id]
	if !ok {
		td.Fatalf(t, "no stream for %s", id)
	}
	return s
}

func (e *transcript) running(t *testing.T) *running {
	if e.r == nil {
		t.Fatal("the primary is not running")
	}
	return e.r
}

// cleanup ends what a transcript left open; start's own cleanup stops
// the primary.
func (e *transcript) cleanup() {
	for _, s := range e.streams {
		s.cancel()
	}
	if e.gate != nil {
		e.gate.down.Store(true)
		close(e.gate.open)
		e.gate = nil
	}
}
