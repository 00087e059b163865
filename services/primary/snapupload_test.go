package primary

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/recovery"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/services/logstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// runLogStore runs a log store on an in-memory filesystem until the test
// ends and returns its address.
func runLogStore(t *testing.T, fs vfs.FS) string {
	t.Helper()
	cfg := logstore.DefaultConfig()
	cfg.Listen, cfg.MetricsListen, cfg.DataDir, cfg.FS = "127.0.0.1:0", "", "/ls", fs
	cfg.StopTimeout = 5 * time.Second
	ls, err := logstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ls.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ls.Addr()
}

// TestWarnsWhenTheLogStoresGetNoSnapshot: a primary whose log stores will
// get no base snapshot from it says so at start — with uploads off
// (--logstore-snapshot-every negative), and when the snapshot it recovered
// from has no batch in its WAL (a directory restored before restores wrote
// that batch): either way its log stores and their archive cannot restore
// the cluster once their log no longer starts at LSN 1.
func TestWarnsWhenTheLogStoresGetNoSnapshot(t *testing.T) {
	t.Run("uploads off", func(t *testing.T) {
		var out testkit.Output
		cfg := testConfig(t, filepath.Join(t.TempDir(), "p"))
		cfg.Logger = slog.New(slog.NewTextHandler(&out, nil))
		cfg.LogStores = []string{runLogStore(t, vfs.NewMem())}
		cfg.LogStoreSnapshotEvery = -1
		start(t, cfg)
		testkit.UntilWithin(t, 30*time.Second, "the warning that the log stores cannot restore the cluster", func() bool {
			return strings.Contains(out.String(), "not restorable from its log stores")
		})
	})
	t.Run("snapshot only", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "p")
		cfg := testConfig(t, dir)
		r := start(t, cfg)
		if _, err := r.kv.Put(ctx(t), &walshipv1.PutRequest{Key: "k", Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		if err := r.stop(t); err != nil { // writes a final snapshot
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(dir, "wal")); err != nil {
			t.Fatal(err)
		}
		var out testkit.Output
		cfg.Logger = slog.New(slog.NewTextHandler(&out, nil))
		cfg.LogStores = []string{runLogStore(t, vfs.NewMem())}
		start(t, cfg)
		testkit.UntilWithin(t, 30*time.Second, "the warning that the recovered snapshot cannot be uploaded", func() bool {
			return strings.Contains(out.String(), "recovered from cannot be uploaded")
		})
	})
}

// TestRetentionKeepsTheSnapshotsBatch: retention cuts the WAL up to the
// newest snapshot but keeps the batch that ends at it. A log store takes a
// base snapshot only at a batch end it holds, so a primary restarting from
// that snapshot with a new, empty log store can upload it at once only if
// its WAL still holds that batch. The cut once dropped it whenever it ended
// a segment and a later batch had begun the next one (the cut's argument is
// the first LSN kept, and it was given the LSN after the snapshot's); the
// restarted primary then warned that the snapshot it recovered from could
// not be uploaded.
func TestRetentionKeepsTheSnapshotsBatch(t *testing.T) {
	mem := vfs.NewMem()
	cfg := testConfig(t, "/data")
	cfg.FS = mem
	cfg.SegmentBytes = 64 << 10
	cfg.WALRetentionBytes = 128 << 10 // retention wants a cut past 80%: three segments
	cfg.SnapshotEveryBytes = 1 << 30  // snapshots only when retention asks
	value := make([]byte, 40<<10)     // one batch a segment

	// Hold the first snapshot's fsync until one more batch has begun the
	// next segment, so that a batch after the snapshot's is there when
	// retention cuts, and fail every later snapshot, so that the first
	// stays the newest through the cut and the stop.
	snapTmp := filepath.Join(recovery.SnapshotDir("/data"), "snapshot-")
	held, release := make(chan struct{}), make(chan struct{})
	var syncs atomic.Int32
	mem.InjectSyncError(func(name string) error {
		if !strings.HasPrefix(name, snapTmp) || !strings.HasSuffix(name, ".tmp") {
			return nil
		}
		if syncs.Add(1) == 1 {
			close(held)
			<-release
			return nil
		}
		return vfs.ErrInjected
	})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	r := start(t, cfg)
	c := ctx(t)
	put := func(i int) {
		t.Helper()
		if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: fmt.Sprintf("k%d", i), Value: value}); err != nil {
			t.Fatal(err)
		}
	}
	status := func() *walshipv1.StatusResponse { t.Helper(); return r.status(t) }
	i := 0
	for ; status().WalBytes <= uint64(cfg.WALRetentionBytes)/10*8; i++ {
		if i == 10 {
			t.Fatal("10 Puts of 40 KiB and the WAL is not over 80% of its retention")
		}
		put(i)
	}
	testkit.Until(t, "the snapshot retention asked for", func() bool {
		select {
		case <-held:
			return true
		default:
			return false
		}
	})
	put(i) // begins the next segment
	close(release)
	released = true
	testkit.Until(t, "retention's cut", func() bool { return status().WalFirstLsn > 1 })
	st := status()
	snapLSN := st.SnapshotLsn
	if st.WalFirstLsn > snapLSN {
		t.Errorf("after the cut the WAL starts at LSN %d; want the batch that ends at the snapshot's LSN %d kept", st.WalFirstLsn, snapLSN)
	}
	_ = r.stop(t) // its final snapshot fails: the held one stays the newest
	mem.InjectSyncError(nil)

	var out testkit.Output
	cfg.Logger = slog.New(slog.NewTextHandler(&out, nil))
	lsFS := vfs.NewMem()
	ls := runLogStore(t, lsFS)
	cfg.LogStores = []string{ls}
	r2 := start(t, cfg)
	if got := r2.status(t).SnapshotLsn; got != snapLSN {
		t.Fatalf("restarted from the snapshot at LSN %d; want %d", got, snapLSN)
	}
	conn, err := grpc.NewClient(ls, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lsc := walshipv1.NewLogStoreServiceClient(conn)
	var uploaded bool
	testkit.UntilWithin(t, 30*time.Second, "the new log store to hold the recovered snapshot, or the warning that it cannot", func() bool {
		if strings.Contains(out.String(), "recovered from cannot be uploaded") {
			return true
		}
		st, err := lsc.Status(c, &walshipv1.LogStoreServiceStatusRequest{})
		if err != nil {
			return false
		}
		for _, si := range st.GetSnapshots() {
			if si.GetLsn() == snapLSN {
				uploaded = true
				return true
			}
		}
		return false
	})
	if !uploaded {
		t.Fatalf("the restarted primary cannot upload the snapshot at LSN %d it recovered from:\n%s", snapLSN, out.String())
	}
}

// status is the primary's Status.
func (r *running) status(t *testing.T) *walshipv1.StatusResponse {
	t.Helper()
	st, err := r.admin.Status(ctx(t), &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}
