package restore_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/freeport"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/recovery"
	"github.com/walship/walship/internal/restore"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// oldCluster runs a cluster whose contract names its members (primary,
// replica-0) and waits for one of them (k = 1), commits a few writes and
// returns its log store's address and what its primary showed last.
func oldCluster(t *testing.T) (string, point) {
	t.Helper()
	c := startCluster(t, cluster.Config{LogStores: 1, Replicas: 1, Failover: true, Primary: func(p *primary.Config) {
		p.Policy.Replication, p.Policy.SyncReplicas = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, 1
	}})
	var last point
	for i := range 8 {
		last = write(t, c, c.Primary, i, 8)
	}
	return c.LogStores[0].Addr, last
}

// emptyLogStore runs an empty log store until the test ends.
func emptyLogStore(t *testing.T) string {
	t.Helper()
	cfg := logstore.DefaultConfig()
	cfg.Listen, cfg.MetricsListen, cfg.DataDir = "127.0.0.1:0", "", t.TempDir()
	cfg.StopTimeout = 5 * time.Second
	s, err := logstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, s.Run)
	return s.Addr()
}

// run runs fn until the test ends.
func run(t *testing.T, fn func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Log(err)
		}
	})
}

// newNode is a data node of the new cluster: its id and address.
type newNode struct{ id, addr string }

func newNodes(t *testing.T, ids ...string) []newNode {
	t.Helper()
	var ns []newNode
	for _, id := range ids {
		addr, err := freeport.Pick("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		ns = append(ns, newNode{id, addr})
	}
	return ns
}

func members(ns []newNode) []primary.Member {
	var ms []primary.Member
	for _, n := range ns {
		ms = append(ms, primary.Member{ID: n.id, Addr: n.addr})
	}
	return ms
}

// policy is a new cluster's default policy: k sync replicas (0: none),
// and log store sync if lsSync.
func policy(k int, lsSync bool) primary.Policy {
	p := primary.DefaultPolicy()
	if lsSync {
		p.LogStore = walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC
	}
	if k > 0 {
		p.Replication, p.SyncReplicas = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, k
	}
	return p
}

// newCluster is the first epoch of a new cluster of the data nodes ms (the
// primary first) and the log stores ls, whose primary's policy is pol, as
// that primary would state it.
func newCluster(ms []newNode, ls []string, pol primary.Policy) *restore.NewCluster {
	return &restore.NewCluster{Primary: ms[0].id, Contract: primary.ContractOf(pol, members(ms), ls, primary.DefaultLeaseTimeout)}
}

// startPrimary starts the primary ms[0] on dir with the data nodes ms, the
// log stores ls and the policy pol, and returns it and its log.
func startPrimary(t *testing.T, dir string, ms []newNode, ls []string, pol primary.Policy) (*primary.Server, *testkit.Output) {
	t.Helper()
	var out testkit.Output
	cfg := primary.DefaultConfig()
	cfg.ID, cfg.Listen, cfg.DataDir, cfg.LogStores, cfg.Members = ms[0].id, ms[0].addr, dir, ls, members(ms)
	cfg.Policy = pol
	cfg.StopTimeout = 5 * time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(&out, nil))
	s, err := primary.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, s.Run)
	return s, &out
}

// startReplica starts the replica n of the primary at primaryAddr.
func startReplica(t *testing.T, n newNode, primaryAddr string, ls []string) *replica.Server {
	t.Helper()
	cfg := replica.DefaultConfig()
	cfg.ID, cfg.Listen, cfg.MetricsListen, cfg.DataDir, cfg.Primary, cfg.LogStores = n.id, n.addr, "", t.TempDir(), primaryAddr, ls
	cfg.StopTimeout = 5 * time.Second
	s, err := replica.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, s.Run)
	return s
}

const waiting = "waiting until the previous contract's members apply it"

// opens waits until p takes writes, failing at once if it waits for the
// previous contract's members instead.
func opens(t *testing.T, p *primary.Server, out *testkit.Output) {
	t.Helper()
	testkit.UntilWithin(t, 30*time.Second, "the restored primary to take writes", func() bool {
		if p.TakingWrites() {
			return true
		}
		if strings.Contains(out.String(), waiting) {
			t.Fatalf("the restored primary waits for the previous contract's members:\n%s", out.String())
		}
		return false
	})
}

// TestRestoredClusterOpensWithNewMembers: a restored directory started as
// the primary of a new cluster whose data nodes are not the old cluster's
// opens its first epoch when the restore wrote that cluster's contract
// (restore.NewCluster, walship restore --members). The restored state's
// epoch record holds the old cluster's contract (members primary and
// replica-0, k = 1), and a primary opens only once the previous
// contract's members apply its epoch record: without the new cluster's
// own first epoch it waited for ever for nodes that are never of it. A
// change from the contract the restore wrote is still waited for, under
// the new cluster's members.
func TestRestoredClusterOpensWithNewMembers(t *testing.T) {
	from, last := oldCluster(t)
	restoreNew := func(t *testing.T, nc *restore.NewCluster) (string, *restore.Result) {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "p")
		res, err := restore.Run(t.Context(), restore.Options{LogStores: []string{from}, DataDir: dir, Target: restore.AtLatest(), NewCluster: nc})
		if err != nil {
			t.Fatal(err)
		}
		if res.LSN != last.lsn || res.Digest != last.digest {
			t.Fatalf("restore reached LSN %d, digest %s; the old primary showed LSN %d, digest %s", res.LSN, res.Digest, last.lsn, last.digest)
		}
		checkNewClusterDir(t, dir, res, nc, last)
		return dir, res
	}
	t.Run("no replicas", func(t *testing.T) {
		ns := newNodes(t, "p")
		ls := []string{emptyLogStore(t)}
		pol := policy(0, true)
		dir, res := restoreNew(t, newCluster(ns, ls, pol))
		p, out := startPrimary(t, dir, ns, ls, pol)
		opens(t, p, out)
		// The new log stores get the restored state, with the new
		// cluster's record, as their base snapshot.
		conn := dial(t, ls[0])
		testkit.UntilWithin(t, 30*time.Second, "the new log store to hold a base snapshot at the new cluster's first LSNs", func() bool {
			st, err := walshipv1.NewLogStoreServiceClient(conn).Status(t.Context(), &walshipv1.LogStoreServiceStatusRequest{})
			return err == nil && len(st.Snapshots) > 0 && st.Snapshots[0].Lsn == res.NewEpochLSN
		})
	})
	t.Run("replicas under new ids", func(t *testing.T) {
		ns := newNodes(t, "p", "n1", "n2")
		ls := []string{emptyLogStore(t)}
		pol := policy(1, true)
		dir, _ := restoreNew(t, newCluster(ns, ls, pol))
		p, out := startPrimary(t, dir, ns, ls, pol)
		var reps []*replica.Server
		for _, n := range ns[1:] {
			reps = append(reps, startReplica(t, n, ns[0].addr, ls))
		}
		opens(t, p, out)
		put, err := walshipv1.NewKVServiceClient(dial(t, ns[0].addr)).Put(t.Context(), &walshipv1.PutRequest{Key: "after", Value: []byte("restore")})
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range reps {
			testkit.UntilWithin(t, 30*time.Second, ns[1+i].id+" to apply the write after the restore", func() bool {
				return r.Status().GetVisibleLsn() >= put.Lsn
			})
		}
	})
	t.Run("a changed contract still waits", func(t *testing.T) {
		// The restore's contract: p and n1, k = 1 (no log store sync,
		// which would make every promotion quorum of it meet the log
		// store majority a write waits for). The primary starts with n2
		// added: n2's ack meets the new contract, but n1 must apply the
		// new record before the primary opens.
		ns := newNodes(t, "p", "n1", "n2")
		ls := []string{emptyLogStore(t)}
		pol := policy(1, false)
		dir, _ := restoreNew(t, newCluster(ns[:2], ls, pol))
		p, out := startPrimary(t, dir, ns, ls, pol)
		startReplica(t, ns[2], ns[0].addr, ls)
		testkit.UntilWithin(t, 30*time.Second, "the primary to wait for n1", func() bool {
			if strings.Contains(out.String(), waiting) {
				return true
			}
			if p.TakingWrites() {
				t.Fatalf("the primary opened without waiting for n1:\n%s", out.String())
			}
			return false
		})
		if p.TakingWrites() {
			t.Fatal("the primary takes writes before n1, the only other member of the previous contract, applied its epoch record")
		}
		startReplica(t, ns[1], ns[0].addr, ls)
		testkit.UntilWithin(t, 30*time.Second, "the primary to open once n1 applies its record", p.TakingWrites)
	})
}

// checkNewClusterDir checks that the directory restored with nc is the
// restored state (want) and the new cluster's epoch record after it, in
// its state and at the end of its WAL.
func checkNewClusterDir(t *testing.T, dir string, res *restore.Result, nc *restore.NewCluster, last point) {
	t.Helper()
	rec, err := recovery.Open(recovery.Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.WAL.Close()
	v := rec.Store.Snapshot()
	er, err := keyspace.EpochRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	if v.AppliedLSN() != res.NewEpochLSN || res.NewEpochLSN != res.LSN+2 || rec.WAL.LastLSN() != res.NewEpochLSN || rec.WAL.FirstLSN() > res.LSN ||
		keyspace.UserKeys(v) != last.keys || !proto.Equal(er.GetContract(), nc.Contract) || er.GetEpoch() != res.NewEpoch {
		t.Fatalf("restored directory at LSN %d (WAL %d..%d), %d keys, epoch record %v; want LSN %d, the tail batch kept, %d keys, the new cluster's record of epoch %d",
			v.AppliedLSN(), rec.WAL.FirstLSN(), rec.WAL.LastLSN(), keyspace.UserKeys(v), er, res.LSN+2, last.keys, res.NewEpoch)
	}
}

// dial is a plaintext connection to addr, closed when the test ends.
func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// TestRestoredFromTheArchiveOpensWithNewMembers: the new cluster's first
// epoch is written the same way by a restore from the archive alone.
func TestRestoredFromTheArchiveOpensWithNewMembers(t *testing.T) {
	cfg := archive.Config{URL: "file://" + t.TempDir()}
	c := archived(t, cfg, 1)
	var last point
	for i := range 8 {
		last = write(t, c, c.Primary, i, 8)
	}
	waitArchived(t, c, last.lsn)
	ns := newNodes(t, "p")
	ls := []string{emptyLogStore(t)}
	pol := policy(0, true)
	nc := newCluster(ns, ls, pol)
	dir := filepath.Join(t.TempDir(), "p")
	res, err := restore.Run(t.Context(), restore.Options{Archive: openArchive(t, cfg), DataDir: dir, Target: restore.AtLSN(last.lsn), NewCluster: nc})
	if err != nil {
		t.Fatal(err)
	}
	if res.LSN != last.lsn || res.Digest != last.digest {
		t.Fatalf("restore reached LSN %d, digest %s; the old primary showed LSN %d, digest %s", res.LSN, res.Digest, last.lsn, last.digest)
	}
	checkNewClusterDir(t, dir, res, nc, last)
	p, out := startPrimary(t, dir, ns, ls, pol)
	opens(t, p, out)
}
