package primary

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestCommitMetricsByPolicy: walship_commits_total and
// walship_commit_duration_seconds count each commit under its own policy's
// labels and its result, ok or the code of its failure, however many
// commits of a policy came before (the series of a policy's successful
// commits are looked up once, then reused).
func TestCommitMetricsByPolicy(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	c := ctx(t)
	m := r.s.metrics
	commits := func(dur, rep, result string) float64 {
		return testutil.ToFloat64(m.commits.WithLabelValues(dur, rep, result))
	}
	observed := func(dur, rep string) uint64 {
		var d dto.Metric
		if err := m.commitSeconds.WithLabelValues(dur, rep).(prometheus.Histogram).Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetHistogram().GetSampleCount()
	}
	type labels struct{ dur, rep, result string }
	cases := []struct {
		policy *walshipv1.CommitPolicy
		want   labels
		times  int
	}{
		{&walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED},
			labels{"async", "disabled", "ok"}, 3},
		{&walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_SYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED},
			labels{"sync", "disabled", "ok"}, 2},
		{&walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC},
			labels{"async", "async", "ok"}, 1},
		// No replica is connected: the sync commit times out.
		{&walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_SYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC,
			SyncReplicas: 1, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, SyncTimeout: durationpb.New(time.Millisecond)},
			labels{"sync", "sync", codes.Unavailable.String()}, 2},
	}
	for _, tc := range cases {
		l := tc.want
		before, beforeObs := commits(l.dur, l.rep, l.result), observed(l.dur, l.rep)
		for range tc.times {
			_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("v"), Policy: tc.policy})
			if l.result != "ok" {
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("Put %v = %v; want UNAVAILABLE", tc.policy, err)
				}
			} else if err != nil {
				t.Fatalf("Put %v: %v", tc.policy, err)
			}
		}
		if got := commits(l.dur, l.rep, l.result) - before; got != float64(tc.times) {
			t.Errorf("walship_commits_total%v grew by %v, want %d", l, got, tc.times)
		}
		if got := observed(l.dur, l.rep) - beforeObs; got != uint64(tc.times) {
			t.Errorf("walship_commit_duration_seconds{%s,%s} count grew by %d, want %d", l.dur, l.rep, got, tc.times)
		}
	}
	if got := commits("sync", "sync", "ok"); got != 0 {
		t.Errorf("walship_commits_total{sync,sync,ok} = %v after only failed sync commits, want 0", got)
	}
}

// BenchmarkObserveCommit is what counting one successful commit costs.
func BenchmarkObserveCommit(b *testing.B) {
	m := &metrics{
		commits:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"durability", "replication", "result"}),
		commitSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "h"}, []string{"durability", "replication"}),
	}
	p := Policy{Durability: walshipv1.Durability_DURABILITY_ASYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED}
	b.ReportAllocs()
	for b.Loop() {
		m.observeCommit(p, nil, time.Millisecond)
	}
}
