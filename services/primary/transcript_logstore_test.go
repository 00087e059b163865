package primary

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// scriptedLogStore is a transcript's fake log store: a gRPC server of
// LogStoreService (Append, Status) and EpochService (Fence) whose answers
// the script controls. It refuses a fence or a heartbeat of another
// cluster than its own (if it has one yet), grants a fence of a newer epoch (or a retry of
// its own candidate's), echoes every heartbeat that asks for a reply at
// once (so the primary's lease holds without the script's help), stores
// the batches it is sent, and acknowledges them as durable at once or,
// held, only when the script says so. It records what it was sent for
// logstore-recv to print.
type scriptedLogStore struct {
	walshipv1.UnimplementedEpochServiceServer
	walshipv1.UnimplementedLogStoreServiceServer
	name, addr string

	mu        sync.Mutex
	changed   chan struct{} // closed and replaced on every change
	hold      bool          // batches are acknowledged by logstore-ack only
	promise   uint64
	candidate string
	cluster   string
	stored    []storedBatch // the batches kept, in LSN order
	durable   uint64
	events    []string // fences, cuts and batches not printed yet
	lastSeen  uint64   // the last LSN of the newest batch received
}

// storedBatch is what a scripted log store keeps of a batch.
type storedBatch struct{ Epoch, FirstLsn, LastLsn uint64 }

func newScriptedLogStore(t *testing.T, name string, hold bool) *scriptedLogStore {
	t.Helper()
	l := &scriptedLogStore{name: name, hold: hold, changed: make(chan struct{})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.addr = lis.Addr().String()
	g := grpc.NewServer()
	walshipv1.RegisterEpochServiceServer(g, l)
	walshipv1.RegisterLogStoreServiceServer(g, l)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return l
}

// change wakes whoever waits on l.changed; l.mu is held.
func (l *scriptedLogStore) change() {
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *scriptedLogStore) Fence(_ context.Context, req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cluster != "" && req.ClusterId != l.cluster {
		err := rpcerr.OtherCluster("log store", l.cluster, "the candidate "+req.CandidateId, req.ClusterId)
		l.events = append(l.events, fmt.Sprintf("fence epoch=%d candidate=%s cluster=%s: %v", req.Epoch, req.CandidateId, req.ClusterId, status.Convert(err).Message()))
		l.change()
		return nil, err
	}
	granted := req.Epoch > l.promise || (req.Epoch == l.promise && req.CandidateId == l.candidate)
	verdict := "refused"
	if granted {
		verdict = "granted"
		l.promise, l.candidate = req.Epoch, req.CandidateId
		if l.cluster == "" {
			l.cluster = req.ClusterId
		}
	}
	l.events = append(l.events, fmt.Sprintf("fence epoch=%d candidate=%s cluster=%s: %s", req.Epoch, req.CandidateId, req.ClusterId, verdict))
	l.change()
	return &walshipv1.FenceResponse{Granted: granted, Epoch: l.promise, PrimaryId: l.candidate, ClusterId: l.cluster,
		LastEpoch: l.lastEpoch(), LastLsn: l.durable, Id: l.addr}, nil
}

// lastEpoch is the epoch of the newest durable batch; l.mu is held.
func (l *scriptedLogStore) lastEpoch() uint64 {
	for i := len(l.stored) - 1; i >= 0; i-- {
		if l.stored[i].LastLsn <= l.durable {
			return l.stored[i].Epoch
		}
	}
	return 0
}

func (l *scriptedLogStore) Status(context.Context, *walshipv1.LogStoreServiceStatusRequest) (*walshipv1.LogStoreServiceStatusResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := &walshipv1.LogStoreServiceStatusResponse{DurableLsn: l.durable, Epoch: l.promise, VoteEpoch: l.promise,
		PrimaryId: l.candidate, ClusterId: l.cluster, LastEpoch: l.lastEpoch()}
	for _, b := range l.stored {
		if b.LastLsn > l.durable {
			break
		}
		if st.FirstLsn == 0 {
			st.FirstLsn = b.FirstLsn
		}
		if n := len(st.History); n == 0 || st.History[n-1].Epoch != b.Epoch {
			st.History = append(st.History, &walshipv1.EpochStart{Epoch: b.Epoch, FirstLsn: b.FirstLsn})
		}
	}
	return st, nil
}

// Append runs one stream: the receiving goroutine records what it is
// sent and wakes this one, the only one that sends.
func (l *scriptedLogStore) Append(stream grpc.BidiStreamingServer[walshipv1.AppendRequest, walshipv1.AppendResponse]) error {
	echoes := make(chan int64, 64)
	ended := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				ended <- err
				return
			}
			if err := l.receive(req); err != nil {
				ended <- err
				return
			}
			if hb := req.GetHeartbeat(); hb.GetReplyRequested() {
				select {
				case echoes <- hb.TimeUnixNano:
				case <-stream.Context().Done():
				}
			}
		}
	}()
	var acked uint64
	for {
		l.mu.Lock()
		changed, durable, epoch := l.changed, l.durable, l.promise
		l.mu.Unlock()
		var echo int64
		if durable == acked {
			select {
			case err := <-ended:
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			case echo = <-echoes:
			case <-changed:
				continue
			}
		}
		acked = durable
		if err := stream.Send(&walshipv1.AppendResponse{DurableLsn: durable, Epoch: epoch, HeartbeatTimeUnixNano: echo}); err != nil {
			return err
		}
	}
}

// receive records one Append message.
func (l *scriptedLogStore) receive(req *walshipv1.AppendRequest) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if hb := req.GetHeartbeat(); hb != nil {
		if l.cluster != "" && hb.ClusterId != l.cluster {
			return rpcerr.OtherCluster("log store", l.cluster, "the primary "+hb.PrimaryId, hb.ClusterId)
		}
		if hb.Epoch < l.promise {
			return status.Errorf(codes.FailedPrecondition, "heartbeat.epoch: %d is older than the promised %d", hb.Epoch, l.promise)
		}
		l.promise = hb.Epoch
	}
	if req.GetTruncate() {
		keep := req.GetTruncateAfterLsn()
		l.events = append(l.events, fmt.Sprintf("cut after %d", keep))
		l.cut(keep + 1)
		l.durable = min(l.durable, keep)
	}
	if b := req.GetBatch(); b != nil {
		l.events = append(l.events, fmt.Sprintf("batch %d..%d epoch %d", b.FirstLsn, b.LastLsn, b.Epoch))
		l.cut(b.FirstLsn) // sent again, after the primary restarted
		l.stored = append(l.stored, storedBatch{Epoch: b.Epoch, FirstLsn: b.FirstLsn, LastLsn: b.LastLsn})
		l.lastSeen = b.LastLsn
		if !l.hold {
			l.durable = b.LastLsn
		}
	}
	l.change()
	return nil
}

// cut drops the stored batches from LSN from on; l.mu is held.
func (l *scriptedLogStore) cut(from uint64) {
	i := 0
	for i < len(l.stored) && l.stored[i].FirstLsn < from {
		i++
	}
	l.stored = l.stored[:i]
}

// The transcript commands of the fake log stores.

func (e *transcript) logstore(t *testing.T, td *datadriven.TestData) string {
	name := td.CmdArgs[0].Key
	if e.logstores[name] != nil {
		td.Fatalf(t, "logstore: %s exists", name)
	}
	if e.mem != nil {
		td.Fatalf(t, "logstore: before start")
	}
	l := newScriptedLogStore(t, name, td.HasArg("hold"))
	td.MaybeScanArgs(t, "cluster", &l.cluster)
	e.logstores[name] = l
	e.logstoreNames = append(e.logstoreNames, name)
	return ""
}

func (e *transcript) scripted(t *testing.T, td *datadriven.TestData) *scriptedLogStore {
	l, ok := e.logstores[td.CmdArgs[0].Key]
	if !ok {
		td.Fatalf(t, "no log store %s", td.CmdArgs[0].Key)
	}
	return l
}

// logstoreRecv waits until the log store has received a batch ending at
// or past lsn (lsn=0: nothing), then prints what it was sent since the
// last time.
func (e *transcript) logstoreRecv(t *testing.T, td *datadriven.TestData) string {
	l := e.scripted(t, td)
	var lsn uint64
	td.MaybeScanArgs(t, "lsn", &lsn)
	testkit.Until(t, fmt.Sprintf("log store %s to receive LSN %d", l.name, lsn), func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.lastSeen >= lsn
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	out := strings.Join(l.events, "\n")
	l.events = nil
	if out == "" {
		return "nothing"
	}
	return out
}

// logstoreAck makes the held log store's log durable through lsn.
func (e *transcript) logstoreAck(t *testing.T, td *datadriven.TestData) string {
	l := e.scripted(t, td)
	var lsn uint64
	td.ScanArgs(t, "durable", &lsn)
	l.mu.Lock()
	defer l.mu.Unlock()
	if lsn > l.lastSeen {
		td.Fatalf(t, "logstore-ack: %s has received only up to LSN %d", l.name, l.lastSeen)
	}
	l.durable = max(l.durable, lsn)
	l.change()
	return ""
}

// awaitLogStoreWait waits until a commit waits on the log stores.
func (e *transcript) awaitLogStoreWait(t *testing.T, _ *datadriven.TestData) string {
	r := e.running(t)
	testkit.UntilWithin(t, 20*time.Second, "a commit to wait on the log stores", func() bool { return r.s.peers.lsWaiting.Load() > 0 })
	return fmt.Sprintf("waiting: %d", r.s.peers.lsWaiting.Load())
}

// logstorePromise makes the log store promise a newer epoch to another
// candidate, as if that candidate had fenced it.
func (e *transcript) logstorePromise(t *testing.T, td *datadriven.TestData) string {
	l := e.scripted(t, td)
	var epoch uint64
	td.ScanArgs(t, "epoch", &epoch)
	candidate := "n2"
	td.MaybeScanArgs(t, "primary", &candidate)
	l.mu.Lock()
	defer l.mu.Unlock()
	if epoch <= l.promise {
		td.Fatalf(t, "logstore-promise: %s has promised %d already", l.name, l.promise)
	}
	l.promise, l.candidate = epoch, candidate
	l.change()
	return ""
}
