package primary

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestInflightCommitBytesAreBounded: writes that wait for a replica hold
// their bytes; once they hold --max-inflight-commit-bytes, another write
// — on another connection too — is refused RESOURCE_EXHAUSTED before it
// is sequenced, with the details pkg/client reads as "not applied" and a
// retry delay; once the held writes are answered, writes pass again.
func TestInflightCommitBytesAreBounded(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.MaxValueBytes = 16 << 10
	cfg.MaxInflightCommitBytes = 64 << 10
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	r := start(t, cfg)
	c := ctx(t)
	// A replica that never acknowledges: sync commits wait for it.
	s, err := walshipv1.NewReplicationServiceClient(r.conn).Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{ReplicaId: "slow", Epoch: r.s.epoch, NextLsn: r.s.wal.LastLSN() + 1}}}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			if _, err := s.Recv(); err != nil {
				return
			}
		}
	}()
	value := make([]byte, 15<<10)
	held := make(chan error, 4)
	for i := range 4 {
		go func() {
			_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "held" + string(rune('a'+i)), Value: value, Policy: &walshipv1.CommitPolicy{
				Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_WRITE,
				SyncTimeout: durationpb.New(time.Minute)}})
			held <- err
		}()
	}
	testkit.Until(t, "four writes in flight", func() bool { return r.s.admit.inflight.Load() > 4*15<<10 })

	// Another connection, as another client would.
	other := start2conn(t, r)
	_, err = other.Put(c, &walshipv1.PutRequest{Key: "over", Value: value})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--max-inflight-commit-bytes") {
		t.Fatalf("Put past the in-flight bound = %v; want RESOURCE_EXHAUSTED naming --max-inflight-commit-bytes", err)
	}
	if !client.NotApplied(err) {
		t.Fatalf("pkg/client does not read %v as not applied", err)
	}
	if d := retryInfo(err); d <= 0 {
		t.Fatalf("no RetryInfo in %v", err)
	}
	if g, _ := r.kv.Get(c, &walshipv1.GetRequest{Key: "over"}); g.GetFound() {
		t.Fatal("the refused write was applied")
	}
	if got := testutil.ToFloat64(r.s.admit.refused.WithLabelValues("inflight_bytes")); got != 1 {
		t.Fatalf("walship_write_refusals_total{limit=inflight_bytes} = %v, want 1", got)
	}

	// The replica acknowledges: the held writes are answered, their bytes
	// released, and the refused write passes when sent again.
	answered := 0
	testkit.Until(t, "the held writes to be answered", func() bool {
		// Acks count up to what was sent: ack again until all were.
		if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: &walshipv1.ReplicaAck{WrittenLsn: r.s.wal.LastLSN()}}}); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case err := <-held:
				if err != nil {
					t.Fatalf("held write: %v", err)
				}
				answered++
			default:
				return answered == 4
			}
		}
	})
	if n := r.s.admit.inflight.Load(); n != 0 {
		t.Fatalf("%d bytes still counted in flight after every write was answered", n)
	}
	if _, err := other.Put(c, &walshipv1.PutRequest{Key: "over", Value: value}); err != nil {
		t.Fatalf("Put once the held writes were answered: %v", err)
	}
}

func start2conn(t *testing.T, r *running) walshipv1.KVServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(r.s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return walshipv1.NewKVServiceClient(conn)
}

func retryInfo(err error) time.Duration {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// TestWriteQuota: over --write-quota-bytes-per-second an identity's
// writes are refused RESOURCE_EXHAUSTED, not applied, with the time its
// debt takes to pay back (Kafka's throttle time); pkg/client waits it out
// and its write then passes.
func TestWriteQuota(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.WriteQuotaBytesPerSecond = 10_000
	r := start(t, cfg)
	// The bucket's clock stands still until the client's retries below,
	// then runs from there: a slow machine refills nothing meanwhile.
	var (
		clockMu sync.Mutex
		frozen  = time.Now()
		running time.Time
	)
	clock := func() time.Time {
		clockMu.Lock()
		defer clockMu.Unlock()
		if running.IsZero() {
			return frozen
		}
		return frozen.Add(time.Since(running))
	}
	r.s.admit.mu.Lock()
	r.s.admit.now = clock
	r.s.admit.mu.Unlock()
	c := ctx(t)
	value := make([]byte, 9_000)
	for i := range 2 {
		// The bucket holds a second's worth: the first write takes most
		// of it, the second takes it into debt (a write is admitted while
		// the bucket is not in debt).
		if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: value}); err != nil {
			t.Fatalf("write %d within the quota: %v", i, err)
		}
	}
	_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k2", Value: value})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--write-quota-bytes-per-second") || !client.NotApplied(err) {
		t.Fatalf("write over the quota = %v; want RESOURCE_EXHAUSTED, not applied, naming --write-quota-bytes-per-second", err)
	}
	// About 8 KB of debt at 10 KB/s.
	if d := retryInfo(err); d < 500*time.Millisecond || d > time.Second {
		t.Fatalf("throttle time %v; want about 0.8 s", d)
	}
	if got := testutil.ToFloat64(r.s.admit.throttled.WithLabelValues("")); got < 0.5 {
		t.Fatalf("walship_write_quota_throttle_seconds_total{identity=\"\"} = %v; want the 0.8 s asked", got)
	}
	cl, err := client.New([]string{r.s.Addr()}, client.Options{Retry: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	clockMu.Lock()
	running = time.Now()
	clockMu.Unlock()
	start := time.Now()
	if _, err := cl.Put(c, "k2", value, nil); err != nil {
		t.Fatalf("pkg/client Put over the quota: %v", err)
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("pkg/client's write passed after %v: it did not wait the throttle time", d)
	}
}

// TestQuotaPerIdentity: each identity has its own bucket; one in debt
// does not throttle another, and the debt is paid back at the rate.
func TestQuotaPerIdentity(t *testing.T) {
	a := newAdmission(0, 1000)
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	a.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	for _, step := range []struct {
		id   string
		n    int
		ok   bool
		wait time.Duration
	}{
		{"a", 1500, true, 0},                    // a full bucket admits a write larger than it
		{"a", 1, false, 500 * time.Millisecond}, // a is 500 B in debt
		{"b", 900, true, 0},                     // b is not throttled by a
		{"b", 200, true, 0},                     // b still has 100 B
		{"b", 1, false, 100 * time.Millisecond},
	} {
		err := a.charge(step.id, step.n)
		if (err == nil) != step.ok {
			t.Fatalf("charge(%s, %d) = %v, want ok %v", step.id, step.n, err, step.ok)
		}
		if !step.ok {
			if d := retryInfo(err); d != step.wait {
				t.Fatalf("charge(%s, %d) asks to wait %v, want %v", step.id, step.n, d, step.wait)
			}
		}
	}
	advance(500 * time.Millisecond)
	if err := a.charge("a", 1); err != nil {
		t.Fatalf("a after its debt was paid: %v", err)
	}
	// A bucket that filled up again long ago is forgotten.
	advance(2 * quotaIdle)
	_ = a.charge("c", 1)
	a.mu.Lock()
	_, kept := a.buckets["b"]
	a.mu.Unlock()
	if kept {
		t.Fatal("an idle identity's bucket was kept")
	}
}

// TestLaggingReplicaIsCutOff: a replica that receives but does not flush
// (it acknowledges nothing) is cut off with OUT_OF_RANGE once it is more
// than --max-replica-lag-bytes behind, so that it cannot pin the
// primary's WAL and memory; one that keeps up stays connected.
func TestLaggingReplicaIsCutOff(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.MaxReplicaLagBytes = 64 << 10
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	r := start(t, cfg)
	c := ctx(t)
	hello := func(id string) walshipv1.ReplicationService_StreamClient {
		s, err := walshipv1.NewReplicationServiceClient(r.conn).Stream(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{ReplicaId: id, Epoch: r.s.epoch, NextLsn: r.s.wal.LastLSN() + 1}}}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	lagging, keeping := hello("lagging"), hello("keeping")
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := lagging.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	// The other acknowledges every batch it receives, flushed.
	go func() {
		for {
			m, err := keeping.Recv()
			if err != nil {
				return
			}
			if b := m.GetBatch(); b != nil {
				_ = keeping.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: &walshipv1.ReplicaAck{WrittenLsn: b.GetLastLsn(), FlushedLsn: b.GetLastLsn()}}})
			}
		}
	}()
	value := make([]byte, 4<<10)
	var err error
	for i := 0; ; i++ {
		if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: value}); err != nil {
			t.Fatal(err)
		}
		select {
		case err = <-ended:
		default:
			if i < 1000 {
				continue
			}
			t.Fatalf("the lagging replica is still connected after %d writes of %d bytes", i+1, len(value))
		}
		break
	}
	if status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), "--max-replica-lag-bytes 65536") {
		t.Fatalf("lagging replica's stream ended with %v; want OUT_OF_RANGE naming --max-replica-lag-bytes", err)
	}
	st, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.GetPeers() {
		if want := p.GetId() == "keeping"; p.GetConnected() != want {
			t.Fatalf("peer %s connected %v after the cut-off; want %v", p.GetId(), p.GetConnected(), want)
		}
	}
}
