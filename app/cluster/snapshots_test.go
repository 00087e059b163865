package cluster

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/services/primary"
)

// logStoreStatus is a log store's Status.
func logStoreStatus(t *testing.T, c *Cluster, i int) *walshipv1.LogStoreServiceStatusResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st, err := walshipv1.NewLogStoreServiceClient(c.Conn(c.LogStores[i])).Status(ctx, &walshipv1.LogStoreServiceStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestSnapshotsReachEveryLogStore: the primary's snapshots are uploaded to
// each log store in the background, and each log store's archive then
// verifies clean, restorable from LSN 0 to its end, with snapshots whose
// digest is the primary's at its LSN.
func TestSnapshotsReachEveryLogStore(t *testing.T) {
	c := startCluster(t, Config{LogStores: 2, Primary: func(p *primary.Config) { p.SnapshotEveryBytes = 64 << 10 }})
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	fill(t, kv, "a", 200, 1000) // ~200 KiB of WAL: a few snapshots
	ps, err := c.Status(t.Context(), c.Primary)
	if err != nil {
		t.Fatal(err)
	}
	if ps.SnapshotLsn == 0 {
		t.Fatal("the primary took no snapshot")
	}
	for i := range c.LogStores {
		testkit.UntilWithin(t, 30*time.Second, "the primary's newest snapshot on log store "+c.LogStores[i].Name, func() bool {
			ss := logStoreStatus(t, c, i).Snapshots
			return len(ss) > 0 && ss[len(ss)-1].Lsn == ps.SnapshotLsn
		})
	}
	if n := metric(t, c.Primary.Registry, "walship_primary_snapshot_uploads_total", map[string]string{"result": "ok"}); n < 2 {
		t.Fatalf("%v uploads ok, want one a log store at least", n)
	}
	// What each log store holds is the primary's state at that LSN: its
	// own snapshot file says so.
	mine, err := state.ReadSnapshot(mustOpen(t, filepath.Join(c.cfg.Dir, "primary", "snapshots", state.SnapshotName(ps.SnapshotLsn))), 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.LogStores {
		ss := logStoreStatus(t, c, i).Snapshots
		if got := ss[len(ss)-1]; got.StateDigest != mine.Digest().String() || got.Keys != uint64(mine.Len()) {
			t.Fatalf("%s holds %v, the primary's snapshot has digest %v and %d keys", c.LogStores[i].Name, got, mine.Digest(), mine.Len())
		}
	}
	for i := range c.LogStores {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		resp, err := walshipv1.NewLogStoreServiceClient(c.Conn(c.LogStores[i])).Verify(ctx, &walshipv1.VerifyRequest{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Problems) > 0 || resp.RestorableFromLsn != 0 || resp.RestorableToLsn < ps.SnapshotLsn || len(resp.Snapshots) == 0 {
			t.Fatalf("%s: Verify = %v", c.LogStores[i].Name, resp)
		}
	}
}

// TestSnapshotUploadsAreSpaced: with --logstore-snapshot-every an hour, a
// log store gets the first snapshot and none of the next ones; negative,
// none at all.
func TestSnapshotUploadsAreSpaced(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration
		want  int
	}{{"an hour", time.Hour, 1}, {"never", -1, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCluster(t, Config{LogStores: 1, Primary: func(p *primary.Config) {
				p.SnapshotEveryBytes = 64 << 10
				p.LogStoreSnapshotEvery = tc.every
			}})
			kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
			fill(t, kv, "a", 100, 1000)
			if tc.want > 0 {
				testkit.UntilWithin(t, 30*time.Second, "the first upload", func() bool { return len(logStoreStatus(t, c, 0).Snapshots) > 0 })
			}
			first, err := c.Status(t.Context(), c.Primary)
			if err != nil {
				t.Fatal(err)
			}
			fill(t, kv, "b", 300, 1000) // more snapshots
			ps, err := c.Status(t.Context(), c.Primary)
			if err != nil {
				t.Fatal(err)
			}
			if ps.SnapshotLsn <= first.SnapshotLsn {
				t.Fatalf("no snapshot after the first upload (snapshot LSN %d)", ps.SnapshotLsn)
			}
			if got := logStoreStatus(t, c, 0).Snapshots; len(got) != tc.want {
				t.Fatalf("the log store holds %v, want %d", got, tc.want)
			}
			if n := metric(t, c.Primary.Registry, "walship_primary_snapshot_uploads_total", nil); n != float64(tc.want) {
				t.Fatalf("%v uploads counted, want %d", n, tc.want)
			}
		})
	}
}

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
