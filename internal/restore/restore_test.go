package restore_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/cluster"
	"github.com/walship/walship/internal/recovery"
	"github.com/walship/walship/internal/restore"
	"github.com/walship/walship/internal/vfs"
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
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	sync := &walshipv1.CommitPolicy{Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC}
	var points []point
	for i := range n {
		key := fmt.Sprintf("k%02d", i%17)
		var lsn uint64
		if i%5 == 4 {
			r, err := kv.Delete(t.Context(), &walshipv1.DeleteRequest{Key: key, Policy: sync})
			if err != nil {
				t.Fatal(err)
			}
			lsn = r.Lsn
		} else {
			r, err := kv.Put(t.Context(), &walshipv1.PutRequest{Key: key, Value: []byte(fmt.Sprintf("v%d", i)), Policy: sync})
			if err != nil {
				t.Fatal(err)
			}
			lsn = r.Lsn
		}
		st, err := c.Status(t.Context(), c.Primary)
		if err != nil {
			t.Fatal(err)
		}
		if st.VisibleLsn != lsn {
			t.Fatalf("after the commit at LSN %d the primary shows LSN %d", lsn, st.VisibleLsn)
		}
		// The next batch is made after at: its commit time is later.
		points = append(points, point{lsn: lsn, digest: st.StateDigest, keys: st.Keys, at: time.Now()})
	}
	return c, points
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
	if v.AppliedLSN() != want.lsn || v.Digest().String() != want.digest || uint64(v.Len()) != want.keys {
		t.Fatalf("restored directory opens at LSN %d, digest %s, %d keys; the primary had %s, %d keys at LSN %d",
			v.AppliedLSN(), v.Digest(), v.Len(), want.digest, want.keys, want.lsn)
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
