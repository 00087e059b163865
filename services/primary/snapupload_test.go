package primary

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/services/logstore"
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
