package logstore

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc/codes"
)

// refilled waits until r is no longer refilling.
func (r *running) refilled(t *testing.T) *walshipv1.LogStoreServiceStatusResponse {
	t.Helper()
	var st *walshipv1.LogStoreServiceStatusResponse
	testkit.UntilWithin(t, 30*time.Second, "the log store to end its refill", func() bool {
		st = r.status(t)
		return !st.Refilling
	})
	return st
}

// TestRefillEmptyFromPeers: an empty log store with peers copies what
// they hold before it takes a primary: a Read from LSN 1 then returns the
// peers' batches byte for byte, its history and promise are the peer's,
// and it counts what it copied. It is listed among its own peers (one list
// for every pod) and skips itself.
func TestRefillEmptyFromPeers(t *testing.T) {
	a := start(t, testConfig(t, t.TempDir()))
	bs := append(chain(t, 2, 1, 20, 100), chain(t, 3, 41, 10, 100)...)
	ap := a.append(t)
	ap.heartbeat(3)
	ap.send(bs...)
	ap.waitDurable(60)

	cfg := testConfig(t, t.TempDir())
	cfg.Listen = testkit.FreeAddr(t)
	cfg.Peers = []string{cfg.Listen, a.s.Addr()}
	b := start(t, cfg)
	st := b.refilled(t)
	if st.FirstLsn != 1 || st.DurableLsn != 60 || st.LastEpoch != 3 || st.VoteEpoch != 3 || len(st.History) != 2 {
		t.Fatalf("status after the refill: %v; want LSNs 1..60 of epochs 2 and 3, promised epoch 3", st)
	}
	got, err := b.readAll(t, &walshipv1.ReadRequest{FromLsn: 1})
	if err != nil {
		t.Fatal(err)
	}
	sameBatches(t, got, bs)
	if n := counterValue(t, b.s.metrics.refillBatches); n != float64(len(bs)) {
		t.Errorf("walship_logstore_refill_batches_total = %v, want %d", n, len(bs))
	}
	if n := counterValue(t, b.s.metrics.refillBytes); n == 0 {
		t.Error("walship_logstore_refill_bytes_total = 0 after a refill")
	}
	if b.s.fill.skippedPeers.Load() != 1 {
		t.Errorf("%d peers skipped, want 1 (itself)", b.s.fill.skippedPeers.Load())
	}
	// The primary of epoch 3 goes on where the peers end.
	next := batch(t, 3, 61, 1, 10)
	if ack := b.appendAll(t, next); ack.DurableLsn != 62 {
		t.Fatalf("ack after the refill: %v", ack)
	}
}

// TestRefillWaitsForAPeer: an empty log store whose peers do not answer
// refuses Append (UNAVAILABLE, "refilling") rather than start its log at
// whatever the primary sends first; once a peer answers, it refills. Two
// empty log stores that peer each other (a new cluster) take appends at
// once.
func TestRefillWaitsForAPeer(t *testing.T) {
	peerAddr := testkit.FreeAddr(t)
	cfg := testConfig(t, t.TempDir())
	cfg.Peers = []string{peerAddr}
	b := start(t, cfg)
	if st := b.status(t); !st.Refilling {
		t.Fatalf("empty log store with an unreachable peer: %v; want refilling", st)
	}
	// Operators see it in the status every node answers (walship ctl
	// status), not only in the log store's own.
	if st, err := b.admin.Status(t.Context(), &walshipv1.StatusRequest{}); err != nil || !st.Refilling {
		t.Fatalf("AdminService.Status while refilling: %v, %v; want refilling", st, err)
	}
	ap := b.append(t)
	// The log store may end the stream before the heartbeat is sent
	// (Send then says io.EOF): the refusal is the stream's status.
	_ = ap.stream.Send(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: 1, TimeUnixNano: time.Now().UnixNano(), ReplyRequested: true}})
	wantCode(t, ap.failure(), codes.Unavailable, "refilling from peers", "empty")
	if v := metricValue(t, b.cfg.Registry, "walship_logstore_refilling"); v != 1 {
		t.Errorf("walship_logstore_refilling = %v while refilling", v)
	}

	// The peer comes up, with a log (written before it listens there).
	pcfg := testConfig(t, t.TempDir())
	p := start(t, pcfg)
	p.appendAll(t, chain(t, 1, 1, 5, 10)...)
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	pcfg.Listen = peerAddr
	start(t, pcfg)
	if st := b.refilled(t); st.DurableLsn != 10 || st.FirstLsn != 1 {
		t.Fatalf("after the peer answered: %v; want LSNs 1..10", st)
	}
	if v := metricValue(t, b.cfg.Registry, "walship_logstore_refilling"); v != 0 {
		t.Errorf("walship_logstore_refilling = %v after the refill", v)
	}
	if st, err := b.admin.Status(t.Context(), &walshipv1.StatusRequest{}); err != nil || st.Refilling {
		t.Errorf("AdminService.Status after the refill: %v, %v; want not refilling", st, err)
	}
}

// TestRefillNewCluster: empty log stores that list each other (and
// themselves) take a primary's appends at once: each finds the others
// empty or refilling too.
func TestRefillNewCluster(t *testing.T) {
	var cfgs []Config
	var addrs []string
	for range 3 {
		cfg := testConfig(t, t.TempDir())
		cfg.Listen = testkit.FreeAddr(t)
		addrs = append(addrs, cfg.Listen)
		cfgs = append(cfgs, cfg)
	}
	var rs []*running
	for _, cfg := range cfgs {
		cfg.Peers = addrs
		rs = append(rs, start(t, cfg))
	}
	for _, r := range rs {
		if st := r.refilled(t); st.FirstLsn != 0 {
			t.Fatalf("new cluster: %v", st)
		}
		r.appendAll(t, batch(t, 1, 1, 1, 10))
	}
}

// TestRefillOnlyItself: a log store whose peers are only itself (one
// list for every pod, scaled down to one) does not wait for anyone.
func TestRefillOnlyItself(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Listen = testkit.FreeAddr(t)
	cfg.Peers = []string{cfg.Listen}
	r := start(t, cfg)
	r.refilled(t)
	r.appendAll(t, batch(t, 1, 1, 1, 10))
}

// TestRefillGap: a log store whose primary's oldest batch starts past its
// end (it was away longer than the primary keeps its WAL) refuses the
// stream with UNAVAILABLE, copies the missing batches from the peer that
// has them, and then takes the primary's stream from its new end. Without
// peers the gap stays INVALID_ARGUMENT (TestContinuity).
func TestRefillGap(t *testing.T) {
	bs := chain(t, 1, 1, 50, 100) // LSNs 1..100
	a := start(t, testConfig(t, t.TempDir()))
	a.appendAll(t, bs...)
	cfg := testConfig(t, t.TempDir())
	cfg.Peers = []string{a.s.Addr()}
	b := start(t, cfg)
	b.refilled(t) // a peer holds LSNs 1..100: copied at start
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	// Away: it keeps LSNs 1..10 only (a fresh one, filled by a primary).
	cfg = testConfig(t, t.TempDir())
	b = start(t, cfg)
	b.appendAll(t, bs[:5]...)
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	cfg.Peers = []string{a.s.Addr()}
	b = start(t, cfg)
	if st := b.status(t); st.Refilling || st.DurableLsn != 10 {
		t.Fatalf("a log store that is not empty refills only on a gap: %v", st)
	}
	// The primary (epoch 1) now keeps LSNs from 81 on.
	ap := b.append(t)
	ap.heartbeat(1)
	ap.send(bs[40])
	wantCode(t, ap.failure(), codes.Unavailable, "refilling from peers", "starts at LSN 81", "last LSN 10")
	st := b.refilled(t)
	if st.DurableLsn != 100 || st.FirstLsn != 1 {
		t.Fatalf("after the refill: %v; want LSNs 1..100", st)
	}
	got, err := b.readAll(t, &walshipv1.ReadRequest{FromLsn: 1})
	if err != nil {
		t.Fatal(err)
	}
	sameBatches(t, got, bs)
	next := batch(t, 1, 101, 1, 10)
	if ack := b.appendAll(t, bs[40], next); ack.DurableLsn != 102 {
		t.Fatalf("the primary's stream after the refill: %v", ack)
	}
}

// TestRefillFollowsTheNewestHistory: peers disagree after LSN 10 — one
// ends in a tail of epoch 2 that epoch 3 cut (its primary never reached
// it), the other holds epoch 3 from there. An empty log store copies the
// newest epoch's log. One that promised epoch 3 never copies from the
// peer whose log ends in epoch 2, even when it is the only one; and a
// refill stops if a fence promises an epoch newer than its peer's log
// meanwhile.
func TestRefillFollowsTheNewestHistory(t *testing.T) {
	common := chain(t, 1, 1, 5, 10)               // 1..10, epoch 1
	deposed := chain(t, 2, 11, 5, 10)             // 11..20, epoch 2 (cut by epoch 3)
	current := chain(t, 3, 11, 10, 10)            // 11..30, epoch 3
	old := start(t, testConfig(t, t.TempDir()))   // ends in epoch 2
	newer := start(t, testConfig(t, t.TempDir())) // ends in epoch 3
	old.appendAll(t, append(common, deposed...)...)
	newer.appendAll(t, append(common, current...)...)

	t.Run("empty", func(t *testing.T) {
		cfg := testConfig(t, t.TempDir())
		cfg.Peers = []string{old.s.Addr(), newer.s.Addr()}
		b := start(t, cfg)
		if st := b.refilled(t); st.DurableLsn != 30 || st.LastEpoch != 3 {
			t.Fatalf("refilled to %v; want the epoch 3 log to LSN 30", st)
		}
		got, err := b.readAll(t, &walshipv1.ReadRequest{FromLsn: 1})
		if err != nil {
			t.Fatal(err)
		}
		sameBatches(t, got, append(common, current...))
	})

	t.Run("promised", func(t *testing.T) {
		// 1..10 of epoch 1, then fenced for epoch 3; its primary's oldest
		// batch is at 21.
		cfg := testConfig(t, t.TempDir())
		b := start(t, cfg)
		b.appendAll(t, common...)
		fence := walshipv1.NewEpochServiceClient(b.conn)
		if resp, err := fence.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 3, CandidateId: "n1", CandidateAddr: "n1:1"}); err != nil || !resp.Granted {
			t.Fatalf("fence: %v, %v", resp, err)
		}
		if err := b.stop(); err != nil {
			t.Fatal(err)
		}
		cfg.Peers = []string{old.s.Addr()}
		b = start(t, cfg)
		ap := b.append(t)
		ap.heartbeat(3)
		ap.send(current[5])
		wantCode(t, ap.failure(), codes.Unavailable, "refilling from peers")
		if st := b.refilled(t); st.DurableLsn != 10 {
			t.Fatalf("copied from a peer whose log ends in an older epoch than the promise: %v", st)
		}
		if err := b.stop(); err != nil {
			t.Fatal(err)
		}
		cfg.Peers = []string{old.s.Addr(), newer.s.Addr()}
		b = start(t, cfg)
		ap = b.append(t)
		ap.heartbeat(3)
		ap.send(current[5])
		wantCode(t, ap.failure(), codes.Unavailable, "refilling from peers")
		if st := b.refilled(t); st.DurableLsn != 30 || st.LastEpoch != 3 {
			t.Fatalf("after the refill: %v; want epoch 3's log to LSN 30", st)
		}
	})

	t.Run("fenced meanwhile", func(t *testing.T) {
		// The writer's own checks, on batches queued as the refiller
		// queues them: a refill from a peer whose log ends in epoch 3 is
		// refused once the log store promised epoch 4, and a batch that
		// is not of the epoch the peer's history says is refused.
		b := start(t, testConfig(t, t.TempDir()))
		h := datadir.History{{Epoch: 1, FirstLSN: 1}, {Epoch: 3, FirstLSN: 11}}
		rf := &refill{peer: "p", lastEpoch: 3, history: h}
		if err := b.queueRefill(t, rf, common...); err != nil {
			t.Fatalf("refill of epoch 1 batches: %v", err)
		}
		wrong := &refill{peer: "p", lastEpoch: 3, history: datadir.History{{Epoch: 1, FirstLSN: 1}, {Epoch: 3, FirstLSN: 21}}}
		wantCode(t, toStatus(b.queueRefill(t, wrong, current[0])), codes.DataLoss, "is of epoch 3", "epoch 1 wrote LSN 11")
		fence := walshipv1.NewEpochServiceClient(b.conn)
		if resp, err := fence.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 4, CandidateId: "n2", CandidateAddr: "n2:1"}); err != nil || !resp.Granted {
			t.Fatalf("fence: %v, %v", resp, err)
		}
		wantCode(t, toStatus(b.queueRefill(t, rf, current[0])), codes.FailedPrecondition, "promised epoch 4", "epoch 3")
		if st := b.status(t); st.DurableLsn != 10 || st.VoteEpoch != 4 {
			t.Fatalf("after refused refills: %v", st)
		}
		if v, err := datadir.LoadVote(vfs.OS, b.cfg.DataDir); err != nil || v.Epoch != 4 || v.Primary != "n2" {
			t.Fatalf("vote: %v, %v", v, err)
		}
	})
}

// metricValue is the value of the unlabelled gauge or counter name in reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// queueRefill hands bs to the writer as the refiller does and waits for
// the outcome.
func (r *running) queueRefill(t *testing.T, rf *refill, bs ...*walshipv1.WalBatch) error {
	t.Helper()
	st := &appendStream{budget: semaphore.NewWeighted(1), wake: make(chan struct{}, 1)}
	for _, b := range bs {
		req, err := checkRequest(&walshipv1.AppendRequest{Batch: b}, r.s.knownEpoch(), datadir.MaxEpochGap)
		if err != nil {
			t.Fatal(err)
		}
		req.st, req.refill, req.weight = st, rf, 0
		if err := r.s.enqueue(req); err != nil {
			t.Fatal(err)
		}
	}
	return r.s.awaitStream(t.Context(), st)
}

// TestRefillStaysInItsCluster: an empty log store with no cluster id
// adopts its peer's with what it copies; one of another cluster copies
// nothing from it and counts the mismatch.
func TestRefillStaysInItsCluster(t *testing.T) {
	a := start(t, testConfig(t, t.TempDir()))
	ap := a.append(t)
	ap.beat(2, clusterA)
	ap.send(chain(t, 2, 1, 10, 100)...)
	ap.waitDurable(20)

	cfg := testConfig(t, t.TempDir())
	cfg.Peers = []string{a.s.Addr()}
	b := start(t, cfg)
	if st := b.refilled(t); st.DurableLsn != 20 || st.ClusterId != clusterA {
		t.Fatalf("an empty log store after its refill: durable LSN %d, cluster %q; want 20 and the peer's %s", st.DurableLsn, st.ClusterId, clusterA)
	}

	dir := t.TempDir()
	if err := datadir.SaveCluster(vfs.OS, dir, clusterB); err != nil {
		t.Fatal(err)
	}
	cfg = testConfig(t, dir)
	cfg.Peers = []string{a.s.Addr()}
	c := start(t, cfg)
	testkit.Until(t, "the log store of cluster B to meet its peer of cluster A", func() bool {
		return counterValue(t, c.s.metrics.clusterMismatch) > 0
	})
	if st := c.status(t); st.FirstLsn != 0 || st.ClusterId != clusterB {
		t.Fatalf("a log store of cluster B with a peer of cluster A: LSNs from %d, cluster %q; want nothing copied, still %s", st.FirstLsn, st.ClusterId, clusterB)
	}
}

// TestRefillEmptyKeepsThePeersHistory: an empty log store whose peer's
// retention cut its oldest batches copies the peer's log from where it
// starts, and takes its history whole — the epochs before its first LSN
// too — ending with the peer's Status: a history that started at its
// first LSN would tell a restore, a primary or the archive's uploader
// nothing of the epochs before it.
func TestRefillEmptyKeepsThePeersHistory(t *testing.T) {
	clock := &ageClock{}
	a := start(t, retentionByAge(t, t.TempDir(), clock))
	bs := append(chain(t, 1, 1, 30, 500), chain(t, 2, 61, 30, 500)...) // 1..60 of epoch 1, 61..120 of epoch 2
	a.appendAll(t, bs...)
	clock.set(baseTime.Add(2 * time.Hour)) // every sealed segment is old now
	if _, err := a.s.enforceRetention(t.Context()); err != nil {
		t.Fatal(err)
	}
	peer := a.status(t)
	if peer.FirstLsn <= 61 || len(peer.History) != 2 {
		t.Fatalf("the peer after its retention: %v; want it to keep only epoch 2's last batches, with both epochs in its history", peer)
	}
	cfg := testConfig(t, t.TempDir())
	cfg.Peers = []string{a.s.Addr()}
	b := start(t, cfg)
	st := b.refilled(t)
	if st.FirstLsn != peer.FirstLsn || st.DurableLsn != peer.DurableLsn || st.LastEpoch != peer.LastEpoch {
		t.Fatalf("after the refill: LSNs %d..%d of epoch %d; the peer's %d..%d of epoch %d",
			st.FirstLsn, st.DurableLsn, st.LastEpoch, peer.FirstLsn, peer.DurableLsn, peer.LastEpoch)
	}
	if got, want := datadir.HistoryFromProto(st.History), datadir.HistoryFromProto(peer.History); len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("history %v after the refill, the peer's %v", got, want)
	}
}
