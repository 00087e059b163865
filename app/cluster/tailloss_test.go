package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/vfs"
)

// TestForcedPromotionLosesTheTail: the replica holding the tail is down
// (with the primary); the survivor's dry run finds no quorum and says
// where the loss starts: after its highest_lsn, the end of the most
// advanced log that answered. The forced promotion then loses exactly the
// commits past it — every commit at or below it survives, every one above
// is gone (read back on the new primary) — and they are in the orphan
// file the tail holder cuts when it rejoins, LSN for LSN.
//
// The dry run's at_risk range (what the old primary reported to an
// answerer that no answer holds) is empty here: nobody who answered heard
// of the tail. It is a lower bound of the loss, never more: an answerer
// only hears of LSNs on the stream that carries them.
func TestForcedPromotionLosesTheTail(t *testing.T) {
	c, err := Start(t.Context(), Config{Dir: t.TempDir(), LogStores: 1, Replicas: 2, Failover: true, Primary: TailLossConfig})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var kept, tail []string
	for i := range 5 {
		kept = append(kept, fmt.Sprintf("kept/%d", i))
		tail = append(tail, fmt.Sprintf("tail/%d", i))
	}
	loss, err := c.TailLoss(ctx, kept, tail)
	if err != nil {
		t.Fatal(err)
	}
	dry := loss.DryRun
	if dry.GetQuorum() {
		t.Fatalf("dry run found a quorum without replica-0: %v", dry)
	}
	firstLost, lastLost := loss.Tail[0].LSN-1, loss.Tail[len(loss.Tail)-1].LSN
	// The tail's first commit's records start right after the last kept
	// commit: the loss starts at highest_lsn + 1.
	if want := loss.Kept[len(loss.Kept)-1].LSN; dry.GetHighestLsn() != want {
		t.Fatalf("dry run's highest_lsn %d; want %d, the last commit every survivor holds", dry.GetHighestLsn(), want)
	}
	if from, to := dry.GetAtRiskFromLsn(), dry.GetAtRiskToLsn(); to != 0 && (from < dry.GetHighestLsn()+1 || to > lastLost) {
		t.Fatalf("dry run's at-risk range %d..%d is outside the loss %d..%d", from, to, firstLost, lastLost)
	}
	t.Logf("dry run: highest_lsn %d, at risk %d..%d; lost %d..%d", dry.GetHighestLsn(), dry.GetAtRiskFromLsn(), dry.GetAtRiskToLsn(), dry.GetHighestLsn()+1, lastLost)

	// What survived, read on the new primary: exactly the commits at or
	// below highest_lsn.
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Replicas[1]))
	for _, cm := range append(append([]Commit(nil), loss.Kept...), loss.Tail...) {
		g, err := kv.Get(ctx, &walshipv1.GetRequest{Key: cm.Key, RequirePrimary: true})
		if err != nil {
			t.Fatal(err)
		}
		if survived, want := g.GetFound(), cm.LSN <= dry.GetHighestLsn(); survived != want {
			t.Fatalf("%s (LSN %d): survived %v, want %v (highest_lsn %d)", cm.Key, cm.LSN, survived, want, dry.GetHighestLsn())
		}
	}

	// replica-0 kept the tail: its orphan file holds exactly the lost LSNs.
	if len(loss.Orphans) != 1 {
		t.Fatalf("orphans on replica-0: %v", loss.Orphans)
	}
	o := loss.Orphans[0]
	if o.FirstLSN != dry.GetHighestLsn()+1 || o.LastLSN != lastLost {
		t.Fatalf("orphan %s holds %d..%d; the loss was %d..%d", o.Name, o.FirstLSN, o.LastLSN, dry.GetHighestLsn()+1, lastLost)
	}
	entries, err := datadir.ReadOrphan(vfs.OS, loss.OrphanDir, o.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(loss.Tail) {
		t.Fatalf("orphan holds %d entries; %d commits were lost", len(entries), len(loss.Tail))
	}
}
