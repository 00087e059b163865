package primary

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestStatusPeerLag: the primary's Status gives every hop's lag in
// records, bytes and seconds, as its metrics do (the RUNBOOK sends on-call
// to Status): a replica that acked nothing of the last commits lags by
// them, and reads 0 again once it acks them.
func TestStatusPeerLag(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Registry = prometheus.NewRegistry()
	r := start(t, cfg)
	c := ctx(t)
	first, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "first", Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := walshipv1.NewReplicationServiceClient(r.conn).Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{ReplicaId: "slow", Epoch: r.s.epoch, NextLsn: first.Lsn + 1}}}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			if _, err := s.Recv(); err != nil {
				return
			}
		}
	}()
	if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: &walshipv1.ReplicaAck{
		WrittenLsn: first.Lsn, FlushedLsn: first.Lsn, AppliedLsn: first.Lsn}}}); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "the replica's first ack", func() bool {
		p := peer(r.s.Status(), "slow")
		return p != nil && p.Connected && p.AppliedLsn == first.Lsn
	})
	var last uint64
	for i := range 3 {
		p, err := r.kv.Put(c, &walshipv1.PutRequest{Key: fmt.Sprintf("k%d", i), Value: []byte("value")})
		if err != nil {
			t.Fatal(err)
		}
		last = p.Lsn
	}
	began := time.Now()
	testkit.Until(t, "the lag in seconds to show", func() bool {
		p := peer(r.s.Status(), "slow")
		return p != nil && p.LagSeconds > 0
	})
	p := peer(r.s.Status(), "slow")
	if p.LagRecords != last-first.Lsn || p.LagBytes == 0 || p.LagSeconds <= 0 || p.LagSeconds > time.Since(began).Seconds()+60 {
		t.Errorf("lagging replica in Status: lag_records %d (want %d), lag_bytes %d, lag_seconds %v; want all set", p.LagRecords, last-first.Lsn, p.LagBytes, p.LagSeconds)
	}
	if m := gaugeValue(t, cfg.Registry, "walship_replication_lag_bytes", "replica", "slow", "stage", "apply"); m != float64(p.LagBytes) {
		t.Errorf("walship_replication_lag_bytes{stage=apply} = %v, Status lag_bytes %d; want the same", m, p.LagBytes)
	}

	if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: &walshipv1.ReplicaAck{
		WrittenLsn: last, FlushedLsn: last, AppliedLsn: last}}}); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "the replica's lag to clear", func() bool {
		p := peer(r.s.Status(), "slow")
		return p != nil && p.LagRecords == 0 && p.LagBytes == 0 && p.LagSeconds == 0
	})
}

// peer is the Status entry of peer id, or nil.
func peer(st *walshipv1.StatusResponse, id string) *walshipv1.PeerStatus {
	for _, p := range st.GetPeers() {
		if p.GetId() == id {
			return p
		}
	}
	return nil
}

// gaugeValue is the value of the gauge name with labels kv (name, value,
// ...) in reg, failing the test when there is none.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string, kv ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelsAre(m.GetLabel(), kv...) {
				return metricValue(m)
			}
		}
	}
	t.Fatalf("no %s%v", name, kv)
	return 0
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	return 0
}

// TestRefusedWritesAreCounted: a primary that takes no writes says so in
// walship_primary_taking_writes, and counts every write it refuses by
// reason (reads and read-only Txns are not writes), so that it pages
// however few clients retry.
func TestRefusedWritesAreCounted(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	var closed atomic.Bool
	cfg.Gate = func() error {
		if closed.Load() {
			return errors.New("this node does not hold the election")
		}
		return nil
	}
	r := start(t, cfg)
	c := ctx(t)
	if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if got := gaugeValue(t, reg, "walship_primary_taking_writes"); got != 1 {
		t.Fatalf("walship_primary_taking_writes = %v while the primary takes writes; want 1", got)
	}
	for _, reason := range refusedReasons {
		if got := gaugeValue(t, reg, "walship_primary_refused_writes_total", "reason", reason); got != 0 {
			t.Fatalf("refused writes{reason=%s} = %v before any refusal; want 0", reason, got)
		}
	}

	closed.Store(true)
	if got := gaugeValue(t, reg, "walship_primary_taking_writes"); got != 0 {
		t.Errorf("walship_primary_taking_writes = %v without the election; want 0", got)
	}
	writes := []func() error{
		func() error { _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("v")}); return err },
		func() error { _, err := r.kv.Delete(c, &walshipv1.DeleteRequest{Key: "k"}); return err },
		func() error {
			_, err := r.kv.Txn(c, &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{txnGet("k")}, Failure: []*walshipv1.TxnOp{txnPut("k", []byte("v"))}})
			return err
		},
	}
	for i, w := range writes {
		if err := w(); status.Code(err) != codes.Unavailable {
			t.Fatalf("write %d without the election: %v; want UNAVAILABLE", i, err)
		}
	}
	reads := []func() error{
		func() error { _, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "k"}); return err },
		func() error {
			_, err := r.kv.Txn(c, &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{txnGet("k")}})
			return err
		},
	}
	for i, rd := range reads {
		if err := rd(); status.Code(err) != codes.Unavailable {
			t.Fatalf("read %d without the election: %v; want UNAVAILABLE", i, err)
		}
	}
	if got := gaugeValue(t, reg, "walship_primary_refused_writes_total", "reason", "election"); got != float64(len(writes)) {
		t.Errorf("refused writes{reason=election} = %v; want %d (the writes, not the reads)", got, len(writes))
	}
	if got := gaugeValue(t, reg, "walship_primary_refused_writes_total", "reason", "no_lease"); got != 0 {
		t.Errorf("refused writes{reason=no_lease} = %v; want 0", got)
	}

	closed.Store(false)
	if got := gaugeValue(t, reg, "walship_primary_taking_writes"); got != 1 {
		t.Errorf("walship_primary_taking_writes = %v with the election back; want 1", got)
	}
}
