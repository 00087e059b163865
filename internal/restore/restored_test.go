package restore_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/restore"
	"github.com/walship/walship/internal/testkit"
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
