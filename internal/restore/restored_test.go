package restore_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/restore"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/services/primary"
)

// TestRestoredClusterRestoresFromItsOwnLogStores: a primary started on a
// restored directory with new, empty log stores (the runbook's restore
// procedure) gets its restored state to them as a base snapshot at once,
// not at its first periodic snapshot: the new log stores alone then
// restore the new cluster, both at the restored LSN and after new writes.
func TestRestoredClusterRestoresFromItsOwnLogStores(t *testing.T) {
	old, points := history(t, 20)
	root := t.TempDir()
	res, err := restore.Run(t.Context(), restore.Options{LogStores: []string{old.LogStores[0].Addr},
		DataDir: filepath.Join(root, "primary"), Target: restore.AtLatest()})
	if err != nil {
		t.Fatal(err)
	}
	if want := points[len(points)-1]; res.LSN != want.lsn || res.Digest != want.digest {
		t.Fatalf("restore reached LSN %d, digest %s; want LSN %d, digest %s", res.LSN, res.Digest, want.lsn, want.digest)
	}

	// The new cluster: the restored directory, three empty log stores.
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: root, LogStores: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	addrs := c.LogStoreAddrs()
	testkit.UntilWithin(t, 30*time.Second, "every new log store to hold a base snapshot at the restored LSN", func() bool {
		for _, n := range c.LogStores {
			st, err := walshipv1.NewLogStoreServiceClient(c.Conn(n)).Status(t.Context(), &walshipv1.LogStoreServiceStatusRequest{})
			if err != nil || len(st.Snapshots) == 0 || st.Snapshots[0].Lsn != res.LSN {
				return false
			}
		}
		return true
	})
	again, err := restore.Run(t.Context(), restore.Options{LogStores: addrs, DataDir: filepath.Join(t.TempDir(), "r"), Target: restore.AtLSN(res.LSN)})
	if err != nil {
		t.Fatalf("restore from the new log stores alone to the restored LSN %d: %v", res.LSN, err)
	}
	if again.Digest != res.Digest {
		t.Fatalf("restore from the new log stores reached digest %s at LSN %d; the restored state's is %s", again.Digest, again.LSN, res.Digest)
	}

	// New writes: the new log stores restore them too, to the digest the
	// new primary shows.
	var last point
	for i := range 5 {
		last = write(t, c, c.Primary, 100+i, 8)
	}
	dir := filepath.Join(t.TempDir(), "latest")
	latest, err := restore.Run(t.Context(), restore.Options{LogStores: addrs, DataDir: dir, Target: restore.AtLatest()})
	if err != nil {
		t.Fatalf("restore from the new log stores alone to latest: %v", err)
	}
	if latest.LSN != last.lsn || latest.Digest != last.digest || latest.Snapshot.GetLsn() != res.LSN {
		t.Fatalf("restore from the new log stores reached LSN %d, digest %s, from snapshot %v; the new primary shows LSN %d, digest %s",
			latest.LSN, latest.Digest, latest.Snapshot, last.lsn, last.digest)
	}
	checkDir(t, dir, last)
}

// TestNewLogStoresGetTheRecoveredSnapshot: log stores replaced while the
// primary was down (new, empty ones in their place) hold nothing of the
// history before the primary's WAL, which retention has cut: the primary
// uploads the snapshot it recovered from as soon as it is back, and the
// new log stores alone restore the cluster.
func TestNewLogStoresGetTheRecoveredSnapshot(t *testing.T) {
	root := t.TempDir()
	cfg := cluster.Config{Dir: root, LogStores: 1, Primary: func(p *primary.Config) {
		p.SegmentBytes, p.SnapshotEveryBytes, p.WALRetentionBytes = 64<<10, 64<<10, 256<<10
	}}
	c, err := cluster.Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var last point
	for i := range 300 {
		last = write(t, c, c.Primary, i, 1000)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(c.LogStoreDir(0)); err != nil {
		t.Fatal(err)
	}
	c, err = cluster.Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	ls := walshipv1.NewLogStoreServiceClient(c.Conn(c.LogStores[0]))
	var st *walshipv1.LogStoreServiceStatusResponse
	testkit.UntilWithin(t, 30*time.Second, "the new log store to hold a base snapshot", func() bool {
		st, err = ls.Status(t.Context(), &walshipv1.LogStoreServiceStatusRequest{})
		return err == nil && len(st.Snapshots) > 0
	})
	if st.FirstLsn <= 1 {
		t.Fatalf("the new log store holds the log from LSN %d: the primary's WAL was not cut, the test shows nothing", st.FirstLsn)
	}
	dir := filepath.Join(t.TempDir(), "r")
	res, err := restore.Run(t.Context(), restore.Options{LogStores: []string{c.LogStores[0].Addr}, DataDir: dir, Target: restore.AtLSN(last.lsn)})
	if err != nil {
		t.Fatalf("restore from the new log store alone (log from LSN %d, snapshots %v): %v", st.FirstLsn, st.Snapshots, err)
	}
	if res.Digest != last.digest {
		t.Fatalf("restore from the new log store reached digest %s at LSN %d; the primary had %s", res.Digest, res.LSN, last.digest)
	}
	checkDir(t, dir, last)
}
