package restore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/restore"
	"github.com/walship/walship/internal/s3test"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/primary"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// archived starts a cluster whose log stores archive to cfg (small chunks,
// uploads every 20ms), and whose log stores keep little (so that the
// archive reaches back further than they do).
func archived(t *testing.T, cfg archive.Config, logstores int) *cluster.Cluster {
	t.Helper()
	return startCluster(t, cluster.Config{LogStores: logstores, Replicas: 1, Failover: true,
		Primary: func(p *primary.Config) { p.SnapshotEveryBytes = 64 << 10 },
		LogStore: func(_ int, l *logstore.Config) {
			l.SegmentBytes, l.RetentionBytes = 16<<10, 96<<10
			l.Archive = logstore.ArchiveOptions{Config: cfg, ChunkBytes: 8 << 10, Interval: 20 * time.Millisecond}
		}})
}

// waitArchived waits until the primary reports the archive holding lsn.
func waitArchived(t *testing.T, c *cluster.Cluster, lsn uint64) *walshipv1.ArchiveStatus {
	t.Helper()
	var a *walshipv1.ArchiveStatus
	testkit.UntilWithin(t, 60*time.Second, fmt.Sprintf("the archive to hold LSN %d", lsn), func() bool {
		st, err := c.Status(t.Context(), c.Primary)
		a = st.GetArchive()
		return err == nil && a.GetArchivedLsn() >= lsn
	})
	return a
}

func openArchive(t *testing.T, cfg archive.Config) *archive.Archive {
	t.Helper()
	a, err := archive.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestRestoreFromTheArchiveAlone: a history is archived; every log store
// and node is then gone (their directories removed); restores from the
// archive to an LSN, a time and the latest give the state the primary
// reported there — including points the log stores no longer held.
func TestRestoreFromTheArchiveAlone(t *testing.T) {
	for _, kind := range []string{"file", "s3"} {
		t.Run(kind, func(t *testing.T) {
			cfg := archive.Config{URL: "file://" + filepath.Join(t.TempDir(), "archive")}
			if kind == "s3" {
				srv := s3test.Start(t, "walship")
				for _, kv := range srv.Env() {
					k, v, _ := strings.Cut(kv, "=")
					t.Setenv(k, v)
				}
				cfg = archive.Config{URL: "s3://walship/cluster-a", Endpoint: srv.Endpoint, PathStyle: true}
			}
			c := archived(t, cfg, 3)
			clusterDir := filepath.Dir(c.LogStoreDir(0))
			var points []point
			for i := range 300 {
				points = append(points, write(t, c, c.Primary, i, 600))
			}
			last := points[len(points)-1]
			waitArchived(t, c, last.lsn)
			// The log stores cut the oldest history (retention); the
			// archive keeps it.
			st, err := walshipv1.NewLogStoreServiceClient(c.Conn(c.LogStores[0])).Status(t.Context(), &walshipv1.LogStoreServiceStatusRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if st.FirstLsn <= points[0].lsn {
				t.Fatalf("the log store still holds LSN %d (first %d): the test wants retention to have cut it", points[0].lsn, st.FirstLsn)
			}
			if err := c.Stop(); err != nil {
				t.Fatal(err)
			}
			// Every node's and log store's directory is gone.
			if err := os.RemoveAll(clusterDir); err != nil {
				t.Fatal(err)
			}
			a := openArchive(t, cfg)
			for _, tc := range []struct {
				name   string
				target restore.Target
				want   point
			}{
				{"first commit, gone from the log stores", restore.AtLSN(points[0].lsn), points[0]},
				{"lsn", restore.AtLSN(points[150].lsn), points[150]},
				{"time", restore.AtTime(points[77].at), points[77]},
				{"latest", restore.AtLatest(), last},
			} {
				t.Run(tc.name, func(t *testing.T) {
					dir := filepath.Join(t.TempDir(), "restored")
					res, err := restore.Run(t.Context(), restore.Options{Archive: a, DataDir: dir, Target: tc.target})
					if err != nil {
						t.Fatal(err)
					}
					if res.LSN != tc.want.lsn || res.Digest != tc.want.digest {
						t.Fatalf("restore to %s reached LSN %d, digest %s; want LSN %d, digest %s", tc.target, res.LSN, res.Digest, tc.want.lsn, tc.want.digest)
					}
					checkDir(t, dir, tc.want)
				})
			}
			t.Run("dry run", func(t *testing.T) {
				dir := filepath.Join(t.TempDir(), "restored")
				res, err := restore.Run(t.Context(), restore.Options{Archive: a, DataDir: dir, Target: restore.AtLatest(), DryRun: true})
				if err != nil || res.LSN != last.lsn {
					t.Fatalf("dry run: %v, %v", res, err)
				}
				if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("a dry run wrote %s: %v", dir, err)
				}
			})
			t.Run("beyond the archive", func(t *testing.T) {
				_, err := restore.Run(t.Context(), restore.Options{Archive: a, DataDir: filepath.Join(t.TempDir(), "r"), Target: restore.AtLSN(last.lsn + 1000)})
				if status.Code(err) != codes.OutOfRange {
					t.Fatalf("restore past the archive: %v", err)
				}
			})
		})
	}
}

// TestRestoreFromADamagedArchiveFailsClosed: a chunk flipped, truncated
// or deleted in the bucket fails the restore with DATA_LOSS or
// OUT_OF_RANGE naming the object, never a wrong state.
func TestRestoreFromADamagedArchiveFailsClosed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "archive")
	cfg := archive.Config{URL: "file://" + dir}
	c := archived(t, cfg, 1)
	var points []point
	for i := range 120 {
		points = append(points, write(t, c, c.Primary, i, 600))
	}
	waitArchived(t, c, points[len(points)-1].lsn)
	a := openArchive(t, cfg)
	cat, err := a.Catalog(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	// A chunk no snapshot inside it lets a restore to its end skip.
	var victim archive.Chunk
	for _, ch := range cat.Chunks[len(cat.Chunks)/2:] {
		inside := false
		for _, sn := range cat.Snapshots {
			inside = inside || (sn.LSN >= ch.FirstLSN && sn.LSN <= ch.LastLSN)
		}
		if !inside {
			victim = ch
			break
		}
	}
	if victim.FirstLSN == 0 {
		t.Fatalf("every chunk of the second half holds a snapshot's LSN: %+v %+v", cat.Chunks, cat.Snapshots)
	}
	path := filepath.Join(dir, archive.ChunkName(victim))
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	target := restore.AtLSN(victim.LastLSN)
	for _, tc := range []struct {
		name   string
		damage func()
		code   codes.Code
	}{
		{"flipped", func() { b := append([]byte(nil), orig...); b[len(b)-3] ^= 0x10; os.WriteFile(path, b, 0o600) }, codes.DataLoss},
		{"truncated", func() { os.WriteFile(path, orig[:len(orig)-40], 0o600) }, codes.DataLoss},
		{"deleted", func() { os.Remove(path) }, codes.OutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.damage()
			defer os.WriteFile(path, orig, 0o600)
			out := filepath.Join(t.TempDir(), "r")
			res, err := restore.Run(t.Context(), restore.Options{Archive: a, DataDir: out, Target: target})
			if err == nil {
				t.Fatalf("a restore through a %s chunk succeeded: LSN %d", tc.name, res.LSN)
			}
			if status.Code(err) != tc.code && !(tc.code == codes.DataLoss && isCorrupt(err)) {
				t.Fatalf("%s chunk: %v (code %v), want %v", tc.name, err, status.Code(err), tc.code)
			}
			want := fmt.Sprintf("%d", victim.FirstLSN)
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("%s chunk: %v does not name LSN %s", tc.name, err, want)
			}
			if entries, _ := os.ReadDir(out); len(entries) > 0 {
				// A failed restore may have made the directory, never a
				// data directory in it.
				t.Fatalf("a failed restore left %v in %s", entries, out)
			}
		})
	}
}

// TestRestoreFromADamagedArchiveSnapshot: a base snapshot damaged in the
// bucket fails the restore that starts from it with DATA_LOSS naming it,
// as a damaged chunk does.
func TestRestoreFromADamagedArchiveSnapshot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "archive")
	cfg := archive.Config{URL: "file://" + dir}
	c := archived(t, cfg, 1)
	var last point
	for i := range 120 {
		last = write(t, c, c.Primary, i, 600)
	}
	waitArchived(t, c, last.lsn)
	a := openArchive(t, cfg)
	cat, err := a.Catalog(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(cat.Snapshots) == 0 {
		t.Fatalf("no snapshot in the archive: %d chunks", len(cat.Chunks))
	}
	sn := cat.Snapshots[len(cat.Snapshots)-1]
	path := filepath.Join(dir, archive.SnapshotName(sn))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := restore.Run(t.Context(), restore.Options{Archive: a, DataDir: filepath.Join(t.TempDir(), "r"), Target: restore.AtLSN(sn.LSN)})
	if status.Code(err) != codes.DataLoss || !strings.Contains(err.Error(), archive.SnapshotName(sn)) {
		t.Fatalf("restore to LSN %d from a damaged snapshot: %v, %v; want DATA_LOSS naming %s", sn.LSN, res, err, archive.SnapshotName(sn))
	}
}

func isCorrupt(err error) bool {
	var ce *archive.CorruptError
	return errors.As(err, &ce)
}
