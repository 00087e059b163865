package restore_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/recovery"
	"github.com/walship/walship/internal/restore"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/primary"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// point is what the primary reported at one visible LSN.
type point struct {
	lsn    uint64
	digest string
	keys   uint64
	at     time.Time // after the commit was acknowledged
}

// history runs a cluster with one log store, commits n writes (overwrites
// and deletes among them) one at a time and records, after each, the LSN
// the primary shows and its state digest there; it returns once the log
// store holds them all.
func history(t *testing.T, n int) (*cluster.Cluster, []point) {
	t.Helper()
	c := startCluster(t, cluster.Config{LogStores: 1})
	var points []point
	for i := range n {
		points = append(points, write(t, c, c.Primary, i, 2))
	}
	return c, points
}

func startCluster(t *testing.T, cfg cluster.Config) *cluster.Cluster {
	t.Helper()
	cfg.Dir = t.TempDir()
	c, err := cluster.Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// write commits the i-th write of a history on the primary n (a put of a
// value of size bytes, or every fifth a delete, over 17 keys), waiting for
// the log store majority, and returns what the primary shows after it.
func write(t *testing.T, c *cluster.Cluster, n *cluster.Node, i, size int) point {
	t.Helper()
	kv := walshipv1.NewKVServiceClient(c.Conn(n))
	sync := &walshipv1.CommitPolicy{Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC}
	key := fmt.Sprintf("k%02d", i%17)
	var lsn uint64
	if i%5 == 4 {
		r, err := kv.Delete(t.Context(), &walshipv1.DeleteRequest{Key: key, Policy: sync})
		if err != nil {
			t.Fatal(err)
		}
		lsn = r.Lsn
	} else {
		value := fmt.Appendf(nil, "v%d-", i)
		value = append(value, make([]byte, max(0, size-len(value)))...)
		r, err := kv.Put(t.Context(), &walshipv1.PutRequest{Key: key, Value: value, Policy: sync})
		if err != nil {
			t.Fatal(err)
		}
		lsn = r.Lsn
	}
	st, err := c.Status(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	if st.VisibleLsn != lsn {
		t.Fatalf("after the commit at LSN %d the primary shows LSN %d", lsn, st.VisibleLsn)
	}
	// The next batch is made after at: its commit time is later.
	return point{lsn: lsn, digest: st.StateDigest, keys: st.Keys, at: time.Now()}
}

// checkDir opens a restored directory as a node would and checks its
// state against the primary's at that LSN.
func checkDir(t *testing.T, dir string, want point) {
	t.Helper()
	res, err := recovery.Open(recovery.Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer res.WAL.Close()
	v := res.Store.Snapshot()
	if v.AppliedLSN() != want.lsn || v.Digest().String() != want.digest || keyspace.UserKeys(v) != want.keys {
		t.Fatalf("restored directory opens at LSN %d, digest %s, %d keys; the primary had %s, %d keys at LSN %d",
			v.AppliedLSN(), v.Digest(), keyspace.UserKeys(v), want.digest, want.keys, want.lsn)
	}
	// Its WAL holds the batch ending there, for the new log stores.
	if f := res.WAL.FirstLSN(); want.lsn > 0 && (f == 0 || f > want.lsn || res.WAL.LastLSN() != want.lsn) {
		t.Fatalf("restored directory's WAL ends at LSN %d (first %d); want the batch ending at LSN %d", res.WAL.LastLSN(), res.WAL.FirstLSN(), want.lsn)
	}
}

func TestRestoreToAnLSNATimeAndLatest(t *testing.T) {
	c, points := history(t, 60)
	ls := []string{c.LogStores[0].Addr}
	for _, tc := range []struct {
		name   string
		target restore.Target
		want   point
	}{
		{"lsn", restore.AtLSN(points[20].lsn), points[20]},
		{"first commit", restore.AtLSN(points[0].lsn), points[0]},
		{"time", restore.AtTime(points[33].at), points[33]},
		{"latest", restore.AtLatest(), points[len(points)-1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "restored")
			res, err := restore.Run(t.Context(), restore.Options{LogStores: ls, DataDir: dir, Target: tc.target})
			if err != nil {
				t.Fatal(err)
			}
			if res.LSN != tc.want.lsn || res.Digest != tc.want.digest {
				t.Fatalf("restore to %s reached LSN %d, digest %s; want LSN %d, digest %s", tc.target, res.LSN, res.Digest, tc.want.lsn, tc.want.digest)
			}
			checkDir(t, dir, tc.want)
			if res.ClusterID == "" {
				t.Fatal("no new cluster id")
			}
		})
	}
}

func TestRestoreFailsClosed(t *testing.T) {
	c, points := history(t, 10)
	ls := []string{c.LogStores[0].Addr}
	last := points[len(points)-1]
	inside := points[3].lsn - 1 // a put record inside the commit's batch
	for _, tc := range []struct {
		name   string
		target restore.Target
		code   codes.Code
		want   string
	}{
		{"beyond the log", restore.AtLSN(last.lsn + 100), codes.OutOfRange, "beyond the newest LSN"},
		{"inside a batch", restore.AtLSN(inside), codes.InvalidArgument, "not at a commit"},
		{"a time after the newest commit", restore.AtTime(time.Now().Add(time.Hour)), codes.OutOfRange, "after the newest archived commit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "restored")
			_, err := restore.Run(t.Context(), restore.Options{LogStores: ls, DataDir: dir, Target: tc.target})
			if err == nil || status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restore to %s: %v; want %v naming %q", tc.target, err, tc.code, tc.want)
			}
			if _, err := vfs.OS.Stat(filepath.Join(dir, "snapshots")); err == nil {
				t.Fatal("a failed restore left a data directory")
			}
		})
	}
	t.Run("a non-empty directory", func(t *testing.T) {
		dir := t.TempDir()
		if err := vfs.WriteFile(vfs.OS, filepath.Join(dir, "x"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := restore.Run(t.Context(), restore.Options{LogStores: ls, DataDir: dir, Target: restore.AtLatest()})
		if err == nil || !strings.Contains(err.Error(), "not empty") {
			t.Fatalf("restore into a non-empty directory: %v", err)
		}
	})
}

func TestDryRunWritesNothing(t *testing.T) {
	c, points := history(t, 12)
	dir := filepath.Join(t.TempDir(), "restored")
	res, err := restore.Run(t.Context(), restore.Options{LogStores: []string{c.LogStores[0].Addr}, DataDir: dir, Target: restore.AtLSN(points[7].lsn), DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.LSN != points[7].lsn || res.Batches == 0 || res.Bytes == 0 || res.Digest != "" {
		t.Fatalf("dry run: %+v", res.Plan)
	}
	if _, err := vfs.OS.Stat(dir); err == nil {
		t.Fatal("a dry run created the data directory")
	}
}

// TestRestoreFromABaseSnapshot: a log store whose retention removed the
// start of the log keeps the primary's base snapshots: a restore to an LSN,
// a time or latest after the oldest of them starts from one and gives the
// primary's digest there; a target before it fails, naming what is held.
func TestRestoreFromABaseSnapshot(t *testing.T) {
	c := startCluster(t, cluster.Config{LogStores: 1,
		Primary:  func(p *primary.Config) { p.SnapshotEveryBytes = 64 << 10 },
		LogStore: func(_ int, l *logstore.Config) { l.SegmentBytes, l.RetentionBytes = 16<<10, 96<<10 }})
	var points []point
	for i := range 400 {
		points = append(points, write(t, c, c.Primary, i, 1000))
	}
	ls := walshipv1.NewLogStoreServiceClient(c.Conn(c.LogStores[0]))
	var st *walshipv1.LogStoreServiceStatusResponse
	testkit.UntilWithin(t, 30*time.Second, "the log store to hold a snapshot and to have cut the log before it", func() bool {
		var err error
		st, err = ls.Status(t.Context(), &walshipv1.LogStoreServiceStatusRequest{})
		return err == nil && len(st.Snapshots) > 0 && st.FirstLsn > points[0].lsn+1
	})
	oldest := st.Snapshots[0].Lsn
	var after []point // points a snapshot can reach
	for _, p := range points {
		if p.lsn >= oldest {
			after = append(after, p)
		}
	}
	if len(after) < 3 {
		t.Fatalf("the oldest snapshot is at LSN %d, too close to the end (%d)", oldest, points[len(points)-1].lsn)
	}
	addrs := []string{c.LogStores[0].Addr}
	for _, tc := range []struct {
		name   string
		target restore.Target
		want   point
	}{
		{"lsn", restore.AtLSN(after[len(after)/2].lsn), after[len(after)/2]},
		{"time", restore.AtTime(after[1].at), after[1]},
		{"latest", restore.AtLatest(), points[len(points)-1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "restored")
			res, err := restore.Run(t.Context(), restore.Options{LogStores: addrs, DataDir: dir, Target: tc.target})
			if err != nil {
				t.Fatal(err)
			}
			if res.Snapshot == nil || res.Snapshot.Lsn > tc.want.lsn {
				t.Fatalf("restore to %s started from snapshot %v", tc.target, res.Snapshot)
			}
			if res.LSN != tc.want.lsn || res.Digest != tc.want.digest {
				t.Fatalf("restore to %s reached LSN %d, digest %s; want LSN %d, digest %s", tc.target, res.LSN, res.Digest, tc.want.lsn, tc.want.digest)
			}
			checkDir(t, dir, tc.want)
		})
	}
	// At a snapshot's own LSN nothing is replayed: the batch ending there
	// is read on its own for the directory's WAL (checkDir).
	t.Run("at a snapshot", func(t *testing.T) {
		st, err := ls.Status(t.Context(), &walshipv1.LogStoreServiceStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var want *point
		for _, sn := range st.Snapshots {
			for i := range points {
				if points[i].lsn == sn.Lsn && sn.Lsn >= st.FirstLsn {
					want = &points[i]
				}
			}
		}
		// Retention keeps what a restore from a snapshot needs: the batch
		// ending at the newest snapshot is always held.
		if want == nil {
			t.Fatalf("no snapshot whose batch the log store still holds (log from %d, snapshots %v)", st.FirstLsn, st.Snapshots)
		}
		dir := filepath.Join(t.TempDir(), "restored")
		res, err := restore.Run(t.Context(), restore.Options{LogStores: addrs, DataDir: dir, Target: restore.AtLSN(want.lsn)})
		if err != nil {
			t.Fatal(err)
		}
		if res.Batches != 0 || res.Snapshot.GetLsn() != want.lsn {
			t.Fatalf("restore to the snapshot's LSN %d replayed %d batches from snapshot %v", want.lsn, res.Batches, res.Snapshot)
		}
		checkDir(t, dir, *want)
	})
	t.Run("outside retention", func(t *testing.T) {
		_, err := restore.Run(t.Context(), restore.Options{LogStores: addrs, DataDir: filepath.Join(t.TempDir(), "r"), Target: restore.AtLSN(points[0].lsn)})
		if status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), fmt.Sprintf("snapshots at %d", oldest)) {
			t.Fatalf("restore to LSN %d, before the oldest snapshot (%d) and the log (from %d): %v; want OUT_OF_RANGE naming what is held", points[0].lsn, oldest, st.FirstLsn, err)
		}
	})
}

// TestRestoreAcrossAFailover: writes in epoch 1, a switchover, writes in
// epoch 2: restores to a point of either epoch give the digest the primary
// of that epoch reported, and the lineage names both epochs.
func TestRestoreAcrossAFailover(t *testing.T) {
	c := startCluster(t, cluster.Config{LogStores: 1, Replicas: 1, Failover: true})
	var points []point
	for i := range 20 {
		points = append(points, write(t, c, c.Primary, i, 10))
	}
	resp, err := walshipv1.NewAdminServiceClient(c.Conn(c.Primary)).Switchover(t.Context(), &walshipv1.SwitchoverRequest{Target: c.Replicas[0].Name})
	if err != nil {
		t.Fatal(err)
	}
	for i := 20; i < 40; i++ {
		points = append(points, write(t, c, c.Replicas[0], i, 10))
	}
	addrs := []string{c.LogStores[0].Addr}
	for _, want := range []point{points[10], points[39]} {
		dir := filepath.Join(t.TempDir(), "r")
		res, err := restore.Run(t.Context(), restore.Options{LogStores: addrs, DataDir: dir, Target: restore.AtLSN(want.lsn)})
		if err != nil {
			t.Fatal(err)
		}
		if res.Digest != want.digest {
			t.Fatalf("restore to LSN %d: digest %s, the primary's was %s", want.lsn, res.Digest, want.digest)
		}
		checkDir(t, dir, want)
	}
	res, err := restore.Run(t.Context(), restore.Options{LogStores: addrs, DataDir: filepath.Join(t.TempDir(), "r"), Target: restore.AtLatest()})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Lineage) < 2 || res.Lineage.Current().Epoch != resp.Epoch || res.Digest != points[39].digest {
		t.Fatalf("latest across the switchover: lineage %v, digest %s; want epoch %d last, digest %s", res.Lineage, res.Digest, resp.Epoch, points[39].digest)
	}
}
