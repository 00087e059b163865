package failover

import (
	"testing"

	"github.com/walship/walship/internal/datadir"
)

// The core's decisions sit on every batch of the log store's writer and
// every round of a replica: what they cost, next to an fsync (~300 µs on
// this machine's disk).

func BenchmarkAppendBatch(b *testing.B) {
	s := State{Vote: datadir.Vote{Epoch: 7, Primary: "p", Addr: "p:1"}, LogEpoch: 7, Cluster: "c"}
	hb := &Heartbeat{Epoch: 7, Primary: "p", Addr: "p:1", Cluster: "c"}
	b.ReportAllocs()
	for i := range b.N {
		first := uint64(i)*2 + 1
		as := s.Append(Append{Sender: 7, HB: hb, Batch: &Entry{Epoch: 7, FirstLSN: first, LastLSN: first + 1}, Last: first - 1})
		if !as.Store || as.Refused != nil {
			b.Fatal(as)
		}
	}
}

func BenchmarkEntriesRound(b *testing.B) {
	s := State{Vote: datadir.Vote{Epoch: 7, Primary: "p", Addr: "p:1"}, LogEpoch: 7, Cluster: "c"}
	es := make([]Entry, 16)
	for i := range es {
		es[i] = Entry{Epoch: 7, FirstLSN: uint64(2*i + 1), LastLSN: uint64(2*i + 2)}
	}
	b.ReportAllocs()
	for range b.N {
		if st := s.Entries(7, es); st.Refused != nil || len(st.Effects) != 0 {
			b.Fatal(st)
		}
	}
}

func BenchmarkHeartbeat(b *testing.B) {
	s := State{Vote: datadir.Vote{Epoch: 7, Primary: "p", Addr: "p:1"}, LogEpoch: 7, Cluster: "c"}
	hb := Heartbeat{Epoch: 7, Primary: "p", Addr: "p:1", Cluster: "c", Bound: datadir.MaxEpochJump}
	b.ReportAllocs()
	for range b.N {
		if st := s.Heartbeat(hb); st.Refused != nil || len(st.Effects) != 0 {
			b.Fatal(st)
		}
	}
}
