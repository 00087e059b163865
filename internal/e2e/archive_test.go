package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/s3test"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// The archive as users run it: log store processes uploading to a real
// SeaweedFS bucket (internal/s3test), `walship restore --archive` and
// `walship ctl verify --archive` as commands. Small segments, chunks and
// retention, and a 20 ms upload interval, keep each run short.

// archiveCluster is log stores that archive to a bucket and data nodes
// (nodes[0] starts as the primary) as processes, members of one cluster.
type archiveCluster struct {
	dir       string
	logstores []*procNode
	nodes     []*procNode
	// conns are the test's connections to the processes, by address:
	// the tests poll them.
	conns map[string]*grpc.ClientConn
}

// archiveOpts shape an archiveCluster.
type archiveOpts struct {
	logstores, replicas int
	// logstoreArgs are added to every log store's flags (later flags
	// win).
	logstoreArgs []string
	// env is every log store's environment besides the server's
	// credentials (which come first, so that env overrides them).
	env []string
	// primaryDir, if set, is the primary's data directory (a restored
	// one): the runbook's new cluster after a restore.
	primaryDir string
	// names prefixes the data nodes' ids ("n": n0, the primary, n1...).
	names string
	// prepare, if set, is called with the log stores' addresses and the
	// data nodes' --peers once they are chosen, before anything starts
	// (to restore primaryDir as the first epoch of this cluster).
	prepare func(lsAddrs, peers []string)
}

// archiveFlags are the flags that reach the archive url on srv.
func archiveFlags(srv *s3test.Server, url string) []string {
	return []string{"--archive", url, "--archive-endpoint", srv.Endpoint, "--archive-path-style"}
}

// newArchiveCluster lays out and starts a cluster archiving to url on srv:
// sync durability, commits on a log store majority (and one replica at
// flush when there are replicas).
func newArchiveCluster(t *testing.T, srv *s3test.Server, url string, o archiveOpts) *archiveCluster {
	t.Helper()
	if o.logstores == 0 {
		o.logstores = 3
	}
	if o.names == "" {
		o.names = "n"
	}
	c := &archiveCluster{dir: t.TempDir(), conns: map[string]*grpc.ClientConn{}}
	var lsAddrs []string
	for range o.logstores {
		lsAddrs = append(lsAddrs, testkit.FreeAddr(t))
	}
	for i, addr := range lsAddrs {
		n := &procNode{name: fmt.Sprintf("ls%d", i), serving: "log store serving", addr: addr, metrics: testkit.FreeAddr(t),
			env: append(srv.Env(), o.env...), t: t}
		n.args = append([]string{"logstore", "--listen", addr, "--data-dir", filepath.Join(c.dir, n.name),
			"--peers", strings.Join(lsAddrs, ","), "--segment-bytes", "16384", "--retention-bytes", "131072",
			"--archive-chunk-bytes", "16384", "--archive-interval", "20ms"}, archiveFlags(srv, url)...)
		n.args = append(append(n.args, o.logstoreArgs...), "--metrics-listen", n.metrics)
		c.logstores = append(c.logstores, n)
	}
	var peers []string
	for i := range 1 + o.replicas {
		n := &procNode{name: fmt.Sprintf("%s%d", o.names, i), addr: testkit.FreeAddr(t), metrics: testkit.FreeAddr(t), t: t}
		peers = append(peers, n.name+"="+n.addr)
		c.nodes = append(c.nodes, n)
	}
	for i, n := range c.nodes {
		cmd, serving := "replica", "replica serving"
		if i == 0 {
			cmd, serving = "primary", "primary serving"
		}
		n.serving = serving
		dataDir := filepath.Join(c.dir, n.name)
		if i == 0 && o.primaryDir != "" {
			dataDir = o.primaryDir
		}
		n.args = []string{cmd, "--id", n.name, "--listen", n.addr, "--data-dir", dataDir,
			"--peers", strings.Join(peers, ","), "--logstore", strings.Join(lsAddrs, ","), "--primary", c.nodes[0].addr,
			"--durability", "sync", "--logstore-ack", "sync", "--sync-timeout", "5s", "--heartbeat-interval", "100ms",
			"--snapshot-every-bytes", "65536"}
		if o.replicas > 0 {
			n.args = append(n.args, "--replication", "sync", "--sync-replicas", "1", "--sync-level", "flush")
		}
		n.args = append(n.args, "--metrics-listen", n.metrics)
	}
	if o.prepare != nil {
		o.prepare(lsAddrs, peers)
	}
	for _, n := range c.all() {
		n.start()
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.all() {
				n.p.mu.Lock()
				log := n.p.log.String()
				n.p.mu.Unlock()
				t.Logf("%s's log, last 4 KiB:\n%s", n.name, log[max(0, len(log)-4096):])
			}
		}
	})
	c.waitWritable(t)
	return c
}

// conn is the test's connection to the process at addr.
func (c *archiveCluster) conn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	if cc, ok := c.conns[addr]; ok {
		return cc
	}
	cc := conn(t, addr)
	c.conns[addr] = cc
	return cc
}

func (c *archiveCluster) all() []*procNode {
	return append(append([]*procNode{}, c.logstores...), c.nodes...)
}

func (c *archiveCluster) primary() *procNode { return c.nodes[0] }

// waitWritable waits until the primary takes a write.
func (c *archiveCluster) waitWritable(t *testing.T) {
	t.Helper()
	kv := walshipv1.NewKVServiceClient(c.conn(t, c.primary().addr))
	testkit.UntilWithin(t, time.Minute, "the primary to take a write", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "-ready", Value: []byte("x")}, grpc.WaitForReady(true))
		return err == nil
	})
}

// status is the primary's Status.
func (c *archiveCluster) status(t *testing.T) *walshipv1.StatusResponse {
	t.Helper()
	st, err := walshipv1.NewAdminServiceClient(c.conn(t, c.primary().addr)).Status(t.Context(), &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// logstoreStatus is log store i's Status.
func (c *archiveCluster) logstoreStatus(t *testing.T, i int) *walshipv1.LogStoreServiceStatusResponse {
	t.Helper()
	st, err := walshipv1.NewLogStoreServiceClient(c.conn(t, c.logstores[i].addr)).Status(t.Context(), &walshipv1.LogStoreServiceStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitArchived waits until the primary reports the archive holding its
// last durable LSN, and returns its Status then (its visible LSN and state
// digest are the archive's end, when nothing is written meanwhile).
func (c *archiveCluster) waitArchived(t *testing.T, within time.Duration) *walshipv1.StatusResponse {
	t.Helper()
	var st *walshipv1.StatusResponse
	testkit.UntilWithin(t, within, "the archive to hold the primary's last LSN", func() bool {
		st = c.status(t)
		return st.GetArchive().GetArchivedLsn() >= st.GetDurableLsn() && st.GetVisibleLsn() == st.GetDurableLsn()
	})
	return st
}

// destroy kills every process with SIGKILL and removes every directory.
func (c *archiveCluster) destroy(t *testing.T) {
	t.Helper()
	for _, n := range c.all() {
		if n.p != nil {
			n.p.kill()
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		t.Fatal(err)
	}
}

// walshipCmd runs walship with args and the server's credentials, and
// returns its combined output and exit code.
func walshipCmd(t *testing.T, srv *s3test.Server, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(walshipBin(t), args...)
	cmd.Env = append(cleanEnv(), srv.Env()...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("walship %s: %v", strings.Join(args, " "), err)
	}
	return string(out), 0
}

// restored is what `walship restore` printed of a restore that succeeded.
type restored struct {
	lsn    uint64
	keys   uint64
	digest string
	commit time.Time
	out    string
}

// restoreArchive runs `walship restore --archive ... target... --data-dir
// dir` and fails the test unless it succeeds.
func restoreArchive(t *testing.T, srv *s3test.Server, url, dir string, target ...string) restored {
	t.Helper()
	args := append(append([]string{"restore"}, archiveFlags(srv, url)...), "--data-dir", dir)
	out, code := walshipCmd(t, srv, append(args, target...)...)
	if code != 0 {
		t.Fatalf("walship restore %s: exit %d\n%s", strings.Join(target, " "), code, out)
	}
	r := restored{out: out}
	if _, err := fmt.Sscanf(field(out, "restored"), "LSN %d, %d keys, state digest %s", &r.lsn, &r.keys, &r.digest); err != nil {
		t.Fatalf("walship restore %s: no restored line (%v):\n%s", strings.Join(target, " "), err, out)
	}
	if ct := field(out, "commit time"); ct != "-" {
		var err error
		if r.commit, err = time.Parse(time.RFC3339Nano, ct); err != nil {
			t.Fatalf("commit time %q: %v", ct, err)
		}
	}
	return r
}

// verifyArchive runs `walship ctl verify --archive` and returns its output
// and exit code.
func verifyArchive(t *testing.T, srv *s3test.Server, url string) (string, int) {
	t.Helper()
	return walshipCmd(t, srv, append([]string{"ctl", "verify"}, archiveFlags(srv, url)...)...)
}

// write is an acknowledged write of the load.
type write struct {
	key, value    string
	lsn           uint64
	called, acked time.Time // wall clock: the primary stamps commits with it
}

// archiveLoad writes unique keys under prefix from several clients, one
// sync commit at a time each, recording every acknowledged write with its
// LSN and every write whose outcome is unknown (an error: the cluster may
// have committed it or not).
type archiveLoad struct {
	prefix string
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	acked   []write
	unknown map[string]string // key → value
	errs    int
	first   error
}

func startLoad(t *testing.T, kv walshipv1.KVServiceClient, prefix string, clients int) *archiveLoad {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &archiveLoad{prefix: prefix, cancel: cancel, unknown: map[string]string{}}
	for c := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			pad := make([]byte, 100)
			for i := 0; ctx.Err() == nil; i++ {
				_, _ = rand.Read(pad)
				key := fmt.Sprintf("%s%d/%06d", prefix, c, i)
				value := key + "=" + hex.EncodeToString(pad)
				called := time.Now().Round(0)
				wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
				r, err := kv.Put(wctx, &walshipv1.PutRequest{Key: key, Value: []byte(value)})
				wcancel()
				l.mu.Lock()
				if err != nil {
					l.unknown[key] = value
					// A write the load's own stop cut short is no failure.
					if ctx.Err() == nil {
						l.errs++
						if l.first == nil {
							l.first = err
						}
					}
				} else {
					l.acked = append(l.acked, write{key: key, value: value, lsn: r.Lsn, called: called, acked: time.Now().Round(0)})
				}
				l.mu.Unlock()
			}
		}()
	}
	t.Cleanup(l.stop)
	return l
}

// stop ends the load and waits for its clients.
func (l *archiveLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

// writes returns the acknowledged writes so far.
func (l *archiveLoad) writes() []write {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]write(nil), l.acked...)
}

// failed returns the count of writes that failed before the load was
// stopped, and the first of them.
func (l *archiveLoad) failed() (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.errs, l.first
}

// startReadOnly starts the restored directory dir as a read-only replica.
func startReadOnly(t *testing.T, dir string) *proc {
	t.Helper()
	return startProc(t, "replica serving", "replica", "--read-only", "--id", "restored", "--listen", "127.0.0.1:0",
		"--metrics-listen", "", "--data-dir", dir)
}

// scanAll reads every key under prefix from kv.
func scanAll(t *testing.T, kv walshipv1.KVServiceClient, prefix string) map[string]*walshipv1.KeyValue {
	t.Helper()
	out := map[string]*walshipv1.KeyValue{}
	start, end := prefix, prefix[:len(prefix)-1]+string(prefix[len(prefix)-1]+1)
	for {
		r, err := kv.Scan(t.Context(), &walshipv1.ScanRequest{Start: start, End: end})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range r.Kvs {
			out[p.Key] = p
		}
		if !r.More || len(r.Kvs) == 0 {
			return out
		}
		start = r.Kvs[len(r.Kvs)-1].Key + "\x00"
	}
}

// checkRestoredWrites checks the state a restored node serves against the
// load: every write acknowledged at or below lsn is there with its value
// and its LSN, no acknowledged write after lsn is, and nothing else is but
// writes of unknown outcome.
func checkRestoredWrites(t *testing.T, kv walshipv1.KVServiceClient, l *archiveLoad, lsn uint64) (present int) {
	t.Helper()
	got := scanAll(t, kv, l.prefix)
	acked := map[string]write{}
	for _, w := range l.writes() {
		acked[w.key] = w
		p, ok := got[w.key]
		switch {
		case w.lsn <= lsn && !ok:
			t.Errorf("write %s acknowledged at LSN %d (≤ %d) is not in the restored state", w.key, w.lsn, lsn)
		case w.lsn <= lsn && (string(p.Value) != w.value || p.VersionLsn != w.lsn):
			t.Errorf("write %s acknowledged at LSN %d: restored as %q at LSN %d, want %q", w.key, w.lsn, p.Value, p.VersionLsn, w.value)
		case w.lsn > lsn && ok:
			t.Errorf("write %s acknowledged at LSN %d, after the restored LSN %d, is in the restored state", w.key, w.lsn, lsn)
		case ok:
			present++
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, p := range got {
		if _, ok := acked[k]; ok {
			continue
		}
		if v, ok := l.unknown[k]; !ok || v != string(p.Value) || p.VersionLsn > lsn {
			t.Errorf("the restored state holds %s = %q at LSN %d, which no write of the load wrote", k, p.Value, p.VersionLsn)
		}
	}
	return present
}

// TestArchiveDisasterRecovery is the drill of docs/RUNBOOK.md: a cluster of
// processes (3 log stores archiving to a SeaweedFS bucket, a primary and
// 2 replicas, members of one cluster) under a load of sync commits on a
// log store majority; every node and log store is then destroyed (kill -9,
// directories removed) and `walship restore --archive ... --latest`
// rebuilds a data directory from the bucket alone. Every write
// acknowledged at or below the archived LSN the cluster last reported is
// there with its value, and a read-only replica serves it.
//
//   - quiesced: the load stops and the archive catches up to the primary's
//     last LSN before the destruction; the restore reaches that LSN with
//     the primary's state digest there, and a restore to a time older
//     than what the log stores still keep (they refuse it) gives exactly
//     the writes acknowledged up to the LSN it resolves to. A directory
//     restored with --members then runs as the primary of a new cluster
//     of new ids with new, empty log stores archiving to a new prefix,
//     and that prefix alone restores the new cluster at once, at the new
//     primary's digest.
//   - mid-load: the destruction comes while the load runs; the restore
//     reaches at least the last archived LSN reported.
func TestArchiveDisasterRecovery(t *testing.T) {
	needLinux(t)
	srv := s3test.Start(t, "walship")
	for _, midLoad := range []bool{false, true} {
		name := map[bool]string{false: "quiesced", true: "mid-load"}[midLoad]
		t.Run(name, func(t *testing.T) {
			url := "s3://walship/dr-" + name
			c := newArchiveCluster(t, srv, url, archiveOpts{replicas: 2})
			load := startLoad(t, walshipv1.NewKVServiceClient(c.conn(t, c.primary().addr)), "dr/", 4)
			// The archived LSN the cluster reports, read while the load
			// runs: 3 s of it at least, and until the log stores' retention
			// has cut a hundred of its writes.
			var reported uint64
			var maxLag float64
			started := time.Now()
			testkit.UntilWithin(t, time.Minute, "3 s of load, and the log stores to cut its first 100 writes", func() bool {
				a := c.status(t).GetArchive()
				if a.GetUrl() != url {
					t.Fatalf("the primary reports the archive %v; want %s", a, url)
				}
				reported = max(reported, a.GetArchivedLsn())
				maxLag = max(maxLag, a.GetLagSeconds())
				w := load.writes()
				if time.Since(started) < 3*time.Second || len(w) < 100 {
					return false
				}
				for i := range c.logstores {
					if c.logstoreStatus(t, i).GetFirstLsn() <= w[99].lsn+1 {
						return false
					}
				}
				return true
			})
			if n, err := load.failed(); n > 0 {
				t.Fatalf("%d writes failed under load; first: %v", n, err)
			}
			if reported == 0 {
				t.Fatalf("the cluster reported nothing archived during %v of load", time.Since(started).Round(time.Millisecond))
			}
			// The metric says what Status says (read after it: no less).
			if m := scrape(t, c.primary().metrics, "walship_archive_lsn"); m < float64(reported) {
				t.Fatalf("walship_archive_lsn %v, below the archived LSN %d Status reported before", m, reported)
			}
			var upBytes, upChunks float64
			for _, ls := range c.logstores {
				upBytes += scrape(t, ls.metrics, "walship_archive_uploaded_bytes_total")
				upChunks += scrape(t, ls.metrics, "walship_archive_chunks_uploaded_total")
			}
			loadTime := time.Since(started)
			var final *walshipv1.StatusResponse
			if !midLoad {
				load.stop()
				start := time.Now()
				final = c.waitArchived(t, time.Minute)
				reported = final.GetArchive().GetArchivedLsn()
				t.Logf("archive caught up with the primary's LSN %d %v after the load stopped", final.GetVisibleLsn(), time.Since(start).Round(time.Millisecond))
			}
			writes := load.writes()
			t.Logf("%d writes acknowledged, LSNs %d..%d; archived LSN %d reported; archive lag up to %.2fs under load; %.0f chunks, %.0f KiB uploaded in %v (%.0f KiB/s)",
				len(writes), writes[0].lsn, writes[len(writes)-1].lsn, reported, maxLag, upChunks, upBytes/1024, loadTime.Round(time.Millisecond), upBytes/1024/loadTime.Seconds())

			// The log stores have cut the oldest writes (retention).
			var lsAddrs []string
			firstKept := ^uint64(0)
			for i, ls := range c.logstores {
				lsAddrs = append(lsAddrs, ls.addr)
				firstKept = min(firstKept, c.logstoreStatus(t, i).GetFirstLsn())
			}
			// A time before every commit the log stores can still restore
			// (from their oldest snapshot, at firstKept-1 at the earliest):
			// each of those was committed after its write was sent.
			at := time.Now()
			for _, w := range writes {
				if w.lsn+1 >= firstKept && w.called.Before(at) {
					at = w.called.Add(-time.Microsecond)
				}
			}
			var old write // the newest write acknowledged by then
			for _, w := range writes {
				if !w.acked.After(at) && w.lsn > old.lsn {
					old = w
				}
			}
			if !midLoad {
				if old.lsn == 0 {
					t.Fatalf("the log stores hold from LSN %d: no write was acknowledged before the oldest they can restore", firstKept)
				}
				out, code := walshipCmd(t, srv, "restore", "--logstore", strings.Join(lsAddrs, ","), "--time", at.UTC().Format(time.RFC3339Nano), "--dry-run")
				if code == 0 || errCode(out) != codes.OutOfRange {
					t.Fatalf("the log stores (first LSN %d) restore to the time of LSN %d: exit %d\n%s", firstKept, old.lsn, code, out)
				}
			}

			c.destroy(t)
			load.stop()

			dir := filepath.Join(t.TempDir(), "latest")
			r := restoreArchive(t, srv, url, dir, "--latest")
			t.Logf("restore --latest: LSN %d, %d keys\n%s", r.lsn, r.keys, r.out)
			if r.lsn < reported {
				t.Fatalf("the restore reached LSN %d, before the archived LSN %d the cluster reported", r.lsn, reported)
			}
			if final != nil && (r.lsn != final.GetVisibleLsn() || r.digest != final.GetStateDigest()) {
				t.Fatalf("the restore reached LSN %d, digest %s; the primary was at LSN %d, digest %s", r.lsn, r.digest, final.GetVisibleLsn(), final.GetStateDigest())
			}
			// The user's next step: serve it, read only.
			ro := startReadOnly(t, dir)
			roKV := walshipv1.NewKVServiceClient(ro.dial(t.Context()))
			present := checkRestoredWrites(t, roKV, load, r.lsn)

			t.Logf("%d acknowledged writes in the restored state", present)
			last := writes[len(writes)-1]
			for _, w := range writes {
				if w.lsn <= r.lsn {
					last = w
				}
			}
			g, err := roKV.Get(t.Context(), &walshipv1.GetRequest{Key: last.key})
			if err != nil || string(g.GetValue()) != last.value {
				t.Fatalf("Get %s from the restored node: %v, %v; want %q", last.key, g, err, last.value)
			}
			ro.stop()

			if midLoad {
				return
			}
			// The runbook's next step: a directory restored as the first
			// epoch of a new cluster (--members: new ids m0, m1, m2, one
			// sync replica, new empty log stores that archive to a new
			// prefix), started as its primary. It opens without the old
			// cluster's members (n1, n2, whose contract the restored state
			// held). The new prefix alone restores the new cluster at once
			// (the restored snapshot is uploaded and archived), and after
			// new writes too.
			url2 := url + "-new"
			ndir := filepath.Join(t.TempDir(), "new-cluster")
			nc := newArchiveCluster(t, srv, url2, archiveOpts{replicas: 2, primaryDir: ndir, names: "m", prepare: func(lsAddrs, peers []string) {
				nr := restoreArchive(t, srv, url, ndir, "--latest", "--members", strings.Join(peers, ","), "--new-logstore", strings.Join(lsAddrs, ","),
					"--replication", "sync", "--sync-replicas", "1", "--sync-level", "flush", "--logstore-ack", "sync")
				if nr.lsn != r.lsn || nr.digest != r.digest {
					t.Fatalf("restore --latest --members reached LSN %d, digest %s; without --members LSN %d, digest %s", nr.lsn, nr.digest, r.lsn, r.digest)
				}
			}})
			if _, err := walshipv1.NewKVServiceClient(nc.conn(t, nc.primary().addr)).Put(t.Context(),
				&walshipv1.PutRequest{Key: "dr/after-restore", Value: []byte("new")}); err != nil {
				t.Fatal(err)
			}
			now := nc.waitArchived(t, time.Minute)
			var nr restored
			testkit.UntilWithin(t, time.Minute, "the new prefix alone to restore the new cluster", func() bool {
				out, code := walshipCmd(t, srv, append(append([]string{"restore"}, archiveFlags(srv, url2)...), "--latest", "--dry-run")...)
				if code != 0 {
					return false
				}
				_, _ = fmt.Sscanf(field(out, "resolved LSN"), "%d", &nr.lsn)
				return nr.lsn >= now.GetVisibleLsn()
			})
			nr = restoreArchive(t, srv, url2, filepath.Join(t.TempDir(), "new"), "--latest")
			if nr.lsn != now.GetVisibleLsn() || nr.digest != now.GetStateDigest() {
				t.Fatalf("restore from the new prefix reached LSN %d, digest %s; the new primary is at LSN %d, digest %s",
					nr.lsn, nr.digest, now.GetVisibleLsn(), now.GetStateDigest())
			}
			t.Logf("the new prefix %s alone restores the new cluster (LSN %d)", url2, nr.lsn)
			if out, code := verifyArchive(t, srv, url2); code != 0 {
				t.Errorf("ctl verify --archive %s: exit %d\n%s", url2, code, out)
			}
			nc.destroy(t)
			// A time older than what the log stores kept.
			tdir := filepath.Join(t.TempDir(), "at-time")
			tr := restoreArchive(t, srv, url, tdir, "--time", at.UTC().Format(time.RFC3339Nano))
			if tr.lsn < old.lsn || tr.lsn+1 >= firstKept || tr.commit.After(at) {
				t.Fatalf("restore --time %s (write acknowledged at LSN %d by then; the log stores kept from %d) reached LSN %d committed %v",
					at.UTC().Format(time.RFC3339Nano), old.lsn, firstKept, tr.lsn, tr.commit)
			}
			ro = startReadOnly(t, tdir)
			present = checkRestoredWrites(t, walshipv1.NewKVServiceClient(ro.dial(t.Context())), load, tr.lsn)
			t.Logf("restore --time %s: LSN %d (the log stores kept from %d), %d acknowledged writes", at.UTC().Format(time.RFC3339Nano), tr.lsn, firstKept, present)
			ro.stop()
		})
	}
}

// errCode is the gRPC code walship's error output names ("code = X").
func errCode(out string) codes.Code {
	for _, c := range []codes.Code{codes.DataLoss, codes.OutOfRange, codes.InvalidArgument, codes.FailedPrecondition, codes.Unavailable} {
		if strings.Contains(out, "code = "+c.String()) {
			return c
		}
	}
	return codes.Unknown
}
