package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/s3test"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/replica"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// archives are the kinds of archive the tests run against: a directory,
// and a SeaweedFS bucket (skipped, saying how to build it, without weed).
func archives(t *testing.T) map[string]func(t *testing.T) archive.Config {
	return map[string]func(t *testing.T) archive.Config{
		"file": func(t *testing.T) archive.Config {
			return archive.Config{URL: "file://" + filepath.Join(t.TempDir(), "archive")}
		},
		"s3": func(t *testing.T) archive.Config {
			srv := s3test.Start(t, "walship")
			for _, kv := range srv.Env() {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			return archive.Config{URL: "s3://walship/cluster", Endpoint: srv.Endpoint, PathStyle: true}
		},
	}
}

// archiving makes a cluster's log stores archive to a (small chunks, an
// upload every 20ms) and keep little (96 KiB), and its primary keep
// little WAL (256 KiB) and snapshot often: the archive soon reaches back
// further than anyone else.
func archiving(cfg Config, a archive.Config) Config {
	cfg.Primary = retainLittle
	cfg.LogStore = func(_ int, l *logstore.Config) {
		l.SegmentBytes, l.RetentionBytes = 16<<10, 96<<10
		l.Archive = logstore.ArchiveOptions{Config: a, ChunkBytes: 8 << 10, Interval: 20 * time.Millisecond}
	}
	return cfg
}

// waitArchived waits until the primary reports the archive holding lsn.
func waitArchived(t *testing.T, c *Cluster, lsn uint64) {
	t.Helper()
	testkit.UntilWithin(t, time.Minute, "the archive to hold the last commit", func() bool {
		st, err := c.Status(t.Context(), c.Primary)
		return err == nil && st.GetArchive().GetArchivedLsn() >= lsn
	})
}

// waitAt waits until node n serves reads at lsn, and returns its status.
func waitAt(t *testing.T, c *Cluster, n *Node, lsn uint64, within time.Duration) *walshipv1.StatusResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(c.Conn(n))
	if _, err := kv.Get(ctx, &walshipv1.GetRequest{Key: "k", MinLsn: lsn, WaitTimeout: durationpb.New(within)}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("%s never reached LSN %d: %v", n.Name, lsn, err)
	}
	st, err := c.Status(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestReplicasReseedFromTheArchive: replicas that neither the primary nor
// the log stores can serve catch up from the archive. Replica 0 is
// stopped; the primary's WAL and every log store's retention then move
// past it (the archive keeps it all); replica 1 loses its disk; the
// primary stops. Restarted, replica 0 reads the archive's chunks from
// where it was, and replica 1 — new, with no cluster id — its newest base
// snapshot and the chunks after it; both reach the archive's end with the
// state digest the primary had there. Replica 2 is then promoted, and
// both follow the new primary.
func TestReplicasReseedFromTheArchive(t *testing.T) {
	for kind, archiveOf := range archives(t) {
		t.Run(kind, func(t *testing.T) {
			a := archiveOf(t)
			cfg := archiving(Config{LogStores: 3, Replicas: 3, Failover: true}, a)
			cfg.Replica = func(_ int, r *replica.Config) { r.Archive = a }
			c := startCluster(t, cfg)
			kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
			fill(t, kv, "before", 20, 100)
			waitConverged(t, c)
			left := waitAt(t, c, c.Replicas[0], 1, time.Minute).VisibleLsn
			if err := c.StopReplica(0); err != nil {
				t.Fatal(err)
			}
			if err := c.StopReplica(1); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(filepath.Join(c.cfg.Dir, "replica-1")); err != nil {
				t.Fatal(err)
			}
			fill(t, kv, "away", 600, 1000) // ~600 KiB: past every retention
			last, err := kv.Put(t.Context(), &walshipv1.PutRequest{Key: "last", Value: []byte("v"), Policy: logStoreSync(10 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			waitArchived(t, c, last.Lsn)
			ps, err := c.Status(t.Context(), c.Primary)
			if err != nil {
				t.Fatal(err)
			}
			if ps.VisibleLsn != last.Lsn || ps.WalFirstLsn <= left+1 {
				t.Fatalf("primary at LSN %d, WAL from %d: want it at %d with retention past replica 0's LSN %d", ps.VisibleLsn, ps.WalFirstLsn, last.Lsn, left)
			}
			for i := range c.LogStores {
				if st := lsStatus(t, c, i); st.FirstLsn <= left+1 {
					t.Fatalf("%s still holds LSN %d (from %d): the test wants its retention past replica 0", c.LogStores[i].Name, left+1, st.FirstLsn)
				}
			}
			if err := c.StopNode(c.Primary); err != nil {
				t.Fatal(err)
			}

			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			for i := range 2 {
				if err := c.RestartReplica(ctx, i); err != nil {
					t.Fatal(err)
				}
			}
			for i, used := range []string{"walship_replica_archive_batches_total", "walship_replica_archive_reseeds_total"} {
				r := c.Replicas[i]
				st := waitAt(t, c, r, last.Lsn, 45*time.Second)
				if st.VisibleLsn != ps.VisibleLsn || st.StateDigest != ps.StateDigest || st.Keys != ps.Keys || st.ClusterId != ps.ClusterId {
					t.Fatalf("%s at LSN %d, digest %s, %d keys, cluster %s; the primary had LSN %d, digest %s, %d keys, cluster %s",
						r.Name, st.VisibleLsn, st.StateDigest, st.Keys, st.ClusterId, ps.VisibleLsn, ps.StateDigest, ps.Keys, ps.ClusterId)
				}
				if n := metric(t, r.Registry, used, nil); n == 0 {
					t.Fatalf("%s caught up with %s = 0", r.Name, used)
				}
			}

			// A promotion: replica 2 is the primary of a new epoch, and the
			// two follow it (with depose: the primary still serves).
			admin := walshipv1.NewAdminServiceClient(c.Conn(c.Replicas[2]))
			if _, err := admin.Promote(ctx, &walshipv1.PromoteRequest{Depose: true}, grpc.WaitForReady(true)); err != nil {
				t.Fatal(err)
			}
			testkit.UntilWithin(t, 30*time.Second, "replica-2 to take writes", func() bool {
				p := c.Replicas[2].DataNode().Primary()
				return p != nil && p.TakingWrites()
			})
			kv2 := walshipv1.NewKVServiceClient(c.Conn(c.Replicas[2]))
			after, err := kv2.Put(ctx, &walshipv1.PutRequest{Key: "after", Value: []byte("v"), Policy: logStoreSync(10 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			np, err := c.Status(t.Context(), c.Replicas[2])
			if err != nil {
				t.Fatal(err)
			}
			if np.VisibleLsn < after.Lsn {
				t.Fatalf("the new primary shows LSN %d after a commit at %d", np.VisibleLsn, after.Lsn)
			}
			for _, r := range c.Replicas[:2] {
				if st := waitAt(t, c, r, np.VisibleLsn, 30*time.Second); st.Epoch != np.Epoch || st.VisibleLsn != np.VisibleLsn || st.StateDigest != np.StateDigest {
					t.Fatalf("%s after the promotion: epoch %d, LSN %d, digest %s; the new primary: epoch %d, LSN %d, digest %s",
						r.Name, st.Epoch, st.VisibleLsn, st.StateDigest, np.Epoch, np.VisibleLsn, np.StateDigest)
				}
			}
		})
	}
}

// TestLogStoreRefillsFromTheArchive: a log store away while the primary's
// WAL and its peers' retention moved past its end (only the archive still
// holds what it lacks) refills from the archive, then from its peers or
// the primary for the rest, and takes the primary's stream again, ending
// with its peers' log: the same end and history, the same batches where
// both hold them, and nothing wrong in it (Verify). (That a refill goes on
// from a peer after the archive: TestRefillGapFromTheArchive in
// services/logstore; here the archive keeps up with the peers.)
func TestLogStoreRefillsFromTheArchive(t *testing.T) {
	for kind, archiveOf := range archives(t) {
		t.Run(kind, func(t *testing.T) {
			c := startCluster(t, archiving(Config{LogStores: 3}, archiveOf(t)))
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
			fill(t, kv, "before", 20, 100)
			p, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "all-three", Value: []byte("v"), Policy: logStoreSync(10 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			testkit.UntilWithin(t, 30*time.Second, "logstore-0 to hold the commit", func() bool { return lsStatus(t, c, 0).DurableLsn >= p.Lsn })
			if err := c.StopNode(c.LogStores[0]); err != nil {
				t.Fatal(err)
			}
			fill(t, kv, "away", 600, 1000)
			last, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "last", Value: []byte("v"), Policy: logStoreSync(10 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			waitArchived(t, c, last.Lsn)
			ps, err := c.Status(ctx, c.Primary)
			if err != nil {
				t.Fatal(err)
			}
			if ps.WalFirstLsn <= p.Lsn+1 {
				t.Fatalf("the primary's WAL starts at LSN %d: it could fill logstore-0 (at %d) itself", ps.WalFirstLsn, p.Lsn)
			}
			for i := 1; i < 3; i++ {
				if st := lsStatus(t, c, i); st.FirstLsn <= p.Lsn+1 {
					t.Fatalf("%s keeps LSNs from %d: it could fill logstore-0 (at %d) itself", c.LogStores[i].Name, st.FirstLsn, p.Lsn)
				}
			}
			if err := c.RestartLogStore(ctx, 0); err != nil {
				t.Fatal(err)
			}
			after := shippedAgain(t, c, kv, 0)
			// What the archive held; the rest (here little or nothing: it
			// keeps up) from a peer or the primary.
			if n := metric(t, c.LogStores[0].Registry, "walship_logstore_refill_archive_batches_total", nil); n == 0 {
				t.Fatal("logstore-0 refilled without a batch from the archive")
			}
			// The same log as a peer's.
			var mine, theirs *walshipv1.VerifyResponse
			testkit.UntilWithin(t, 30*time.Second, "logstore-0 and logstore-1 to end at the same LSN", func() bool {
				mine, theirs = verify(t, c, 0), verify(t, c, 1)
				return mine.LastLsn == theirs.LastLsn && mine.LastLsn >= after
			})
			// Its retention may have cut what it copied meanwhile: the
			// archive holds it.
			if len(mine.Problems) != 0 || mine.FirstLsn == 0 {
				t.Fatalf("logstore-0 after its refill: LSNs %d..%d, problems %v", mine.FirstLsn, mine.LastLsn, mine.Problems)
			}
			if !sameHistory(mine.History, theirs.History) {
				t.Fatalf("logstore-0's history %v, its peer's %v", mine.History, theirs.History)
			}
			from := max(mine.FirstLsn, theirs.FirstLsn)
			got, want := readLogStore(t, c, 0, from, theirs.LastLsn), readLogStore(t, c, 1, from, theirs.LastLsn)
			if len(got) != len(want) || len(got) == 0 {
				t.Fatalf("from LSN %d: logstore-0 holds %d batches, logstore-1 %d", from, len(got), len(want))
			}
			for i := range got {
				if !proto.Equal(got[i], want[i]) {
					t.Fatalf("batch %d: logstore-0 %d..%d, logstore-1 %d..%d (or different bytes)", i, got[i].FirstLsn, got[i].LastLsn, want[i].FirstLsn, want[i].LastLsn)
				}
			}
		})
	}
}

// verify is log store i's Verify.
func verify(t *testing.T, c *Cluster, i int) *walshipv1.VerifyResponse {
	t.Helper()
	v, err := walshipv1.NewLogStoreServiceClient(c.Conn(c.LogStores[i])).Verify(t.Context(), &walshipv1.VerifyRequest{})
	if err != nil {
		t.Fatalf("%s: verify: %v", c.LogStores[i].Name, err)
	}
	return v
}

func sameHistory(a, b []*walshipv1.EpochStart) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// TestEmptiedLogStoreBesideTheArchive: a log store that lost its disk
// while its peers' retention cut the old history refills from its peers,
// which hold everything after the archive (they keep it against
// retention), not from the archive: and it ends with a peer's log — the
// same end, the same history (the epochs before its first LSN too), the
// same batches, nothing wrong in it.
func TestEmptiedLogStoreBesideTheArchive(t *testing.T) {
	c := startCluster(t, archiving(Config{LogStores: 3}, archives(t)["file"](t)))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	fill(t, kv, "before", 600, 1000)
	last, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "last", Value: []byte("v"), Policy: logStoreSync(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	waitArchived(t, c, last.Lsn)
	if st := lsStatus(t, c, 1); st.FirstLsn <= 1 {
		t.Fatalf("logstore-1 keeps LSNs from %d: the test wants its retention to have cut the oldest", st.FirstLsn)
	}
	if err := c.StopNode(c.LogStores[0]); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(c.LogStoreDir(0)); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartLogStore(ctx, 0); err != nil {
		t.Fatal(err)
	}
	after := shippedAgain(t, c, kv, 0)
	var mine, theirs *walshipv1.VerifyResponse
	testkit.UntilWithin(t, 30*time.Second, "logstore-0 and logstore-1 to end at the same LSN", func() bool {
		mine, theirs = verify(t, c, 0), verify(t, c, 1)
		return mine.LastLsn == theirs.LastLsn && mine.LastLsn >= after
	})
	if len(mine.Problems) != 0 || !sameHistory(mine.History, theirs.History) {
		t.Fatalf("logstore-0 after its refill: LSNs %d..%d, history %v, problems %v; logstore-1's history %v",
			mine.FirstLsn, mine.LastLsn, mine.History, mine.Problems, theirs.History)
	}
	if n := metric(t, c.LogStores[0].Registry, "walship_logstore_refill_batches_total", nil); n == 0 {
		t.Fatal("logstore-0 refilled nothing")
	}
	if n := metric(t, c.LogStores[0].Registry, "walship_logstore_refill_archive_batches_total", nil); n != 0 {
		t.Fatalf("logstore-0 copied %v batches from the archive; its peers held what it needed", n)
	}
	from := max(mine.FirstLsn, theirs.FirstLsn)
	got, want := readLogStore(t, c, 0, from, theirs.LastLsn), readLogStore(t, c, 1, from, theirs.LastLsn)
	if len(got) != len(want) || len(got) == 0 {
		t.Fatalf("from LSN %d: logstore-0 holds %d batches, logstore-1 %d", from, len(got), len(want))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("batch %d: logstore-0 %d..%d, logstore-1 %d..%d (or different bytes)", i, got[i].FirstLsn, got[i].LastLsn, want[i].FirstLsn, want[i].LastLsn)
		}
	}
}
