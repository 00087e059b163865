package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
)

// TestRestoreProcesses: a log store and a primary as processes, a write
// load, then `walship restore` to an LSN in the middle of it: a dry run
// prints the plan and writes nothing; the restore prints the LSN and the
// state digest the primary reported there; the directory starts as a
// read-only replica that serves exactly that state and takes no write, and
// as the primary of a new cluster that does.
func TestRestoreProcesses(t *testing.T) {
	ctx := t.Context()
	ls := startProc(t, "log store serving", "logstore", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir())
	prim := startProc(t, "primary serving", "primary", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir(),
		"--logstore", ls.addr, "--logstore-ack", "sync")
	kv := walshipv1.NewKVServiceClient(prim.dial(ctx))
	admin := walshipv1.NewAdminServiceClient(prim.dial(ctx))
	type point struct {
		lsn    uint64
		digest string
	}
	var points []point
	for i := range 40 {
		r, err := kv.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("k%d", i%13), Value: []byte(fmt.Sprintf("v%d", i))})
		if err != nil {
			t.Fatal(err)
		}
		st, err := admin.Status(ctx, &walshipv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.VisibleLsn != r.Lsn {
			t.Fatalf("Put at LSN %d, primary visible at %d", r.Lsn, st.VisibleLsn)
		}
		points = append(points, point{r.Lsn, st.StateDigest})
	}
	want := points[25]

	restore := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(walshipBin(t), append([]string{"restore", "--logstore", ls.addr}, args...)...)
		cmd.Env = cleanEnv()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("walship restore %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	dir := filepath.Join(t.TempDir(), "restored")
	lsn := fmt.Sprint(want.lsn)
	out := restore("--data-dir", dir, "--lsn", lsn, "--dry-run")
	if field(out, "resolved LSN") != lsn || field(out, "lineage") != "epoch 1 from LSN 1" || field(out, "dry run") != "nothing written" {
		t.Fatalf("dry run output:\n%s", out)
	}
	if _, err := exec.Command("test", "-e", dir).CombinedOutput(); err == nil {
		t.Fatalf("the dry run created %s", dir)
	}
	out = restore("--data-dir", dir, "--lsn", lsn)
	if !strings.HasPrefix(field(out, "restored"), fmt.Sprintf("LSN %s, ", lsn)) || !strings.HasSuffix(field(out, "restored"), "state digest "+want.digest) {
		t.Fatalf("restore output does not name LSN %s and digest %s:\n%s", lsn, want.digest, out)
	}

	ro := startProc(t, "replica serving", "replica", "--read-only", "--id", "restored", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", dir)
	roConn := ro.dial(ctx)
	st, err := walshipv1.NewAdminServiceClient(roConn).Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.VisibleLsn != want.lsn || st.StateDigest != want.digest {
		t.Fatalf("the read-only node serves LSN %d, digest %s; want LSN %d, digest %s", st.VisibleLsn, st.StateDigest, want.lsn, want.digest)
	}
	roKV := walshipv1.NewKVServiceClient(roConn)
	got, err := roKV.Get(ctx, &walshipv1.GetRequest{Key: "k12"})
	if err != nil || string(got.Value) != "v25" {
		t.Fatalf("Get k12 on the restored node = %v, %v; want v25 (written at LSN %d)", got, err, want.lsn)
	}
	if _, err := roKV.Put(ctx, &walshipv1.PutRequest{Key: "x", Value: []byte("y")}); err == nil {
		t.Fatal("the read-only node took a write")
	}
	if _, err := walshipv1.NewAdminServiceClient(roConn).Promote(ctx, &walshipv1.PromoteRequest{}); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("Promote on the read-only node: %v", err)
	}
	ro.stop()

	// The same directory as the primary of a new cluster: it takes writes
	// from where the restore left it.
	np := startProc(t, "primary serving", "primary", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", dir)
	nkv := walshipv1.NewKVServiceClient(np.dial(ctx))
	r, err := nkv.Put(ctx, &walshipv1.PutRequest{Key: "after", Value: []byte("restore")})
	if err != nil || r.Lsn <= want.lsn {
		t.Fatalf("Put on the restored primary = %v, %v; want an LSN after %d", r, err, want.lsn)
	}
	if got, err := nkv.Get(ctx, &walshipv1.GetRequest{Key: "k12"}); err != nil || string(got.Value) != "v25" {
		t.Fatalf("Get k12 on the restored primary = %v, %v", got, err)
	}
	np.stop()

	// As the RUNBOOK says, with new, empty log stores: the new cluster
	// opens its epoch on them and acknowledges through them.
	dir3 := filepath.Join(t.TempDir(), "restored3")
	restore("--data-dir", dir3, "--lsn", lsn)
	ls3 := startProc(t, "log store serving", "logstore", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir())
	np3 := startProc(t, "primary serving", "primary", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", dir3,
		"--logstore", ls3.addr, "--logstore-ack", "sync", "--snapshot-every-bytes", "8192")
	nkv3 := walshipv1.NewKVServiceClient(np3.dial(ctx))
	// The primary opens its epoch once the new log store holds its epoch
	// record. It never did when the primary could not ship to an empty
	// log store from a WAL that starts after the restored snapshot.
	var after *walshipv1.PutResponse
	testkit.UntilWithin(t, time.Minute, "the restored primary to take a write through a new log store", func() bool {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		r, err := nkv3.Put(pctx, &walshipv1.PutRequest{Key: "after", Value: []byte("restore")})
		after = r
		return err == nil
	})
	if after.Lsn <= want.lsn {
		t.Fatalf("Put on the restored primary with a new log store at LSN %d; want an LSN after %d", after.Lsn, want.lsn)
	}
	if got, err := nkv3.Get(ctx, &walshipv1.GetRequest{Key: "k12"}); err != nil || string(got.Value) != "v25" {
		t.Fatalf("Get k12 on the restored primary with a new log store = %v, %v", got, err)
	}
	// The new cluster's own log stores can restore it once the primary
	// has uploaded a snapshot taken after the restore (the restored one
	// is not uploaded: its batch, which names its commit time, is not in
	// the new WAL). Writes until one is there.
	ls3Admin := walshipv1.NewLogStoreServiceClient(ls3.dial(ctx))
	var upto uint64
	testkit.UntilWithin(t, time.Minute, "the new log store to hold a base snapshot of the new cluster", func() bool {
		if r, err := nkv3.Put(ctx, &walshipv1.PutRequest{Key: "fill", Value: make([]byte, 1024)}); err == nil {
			upto = r.Lsn
		}
		st, err := ls3Admin.Status(ctx, &walshipv1.LogStoreServiceStatusRequest{})
		return err == nil && len(st.Snapshots) > 0
	})
	cmd3 := exec.Command(walshipBin(t), "restore", "--logstore", ls3.addr, "--data-dir", filepath.Join(t.TempDir(), "again"), "--lsn", fmt.Sprint(upto))
	cmd3.Env = cleanEnv()
	if out, err := cmd3.CombinedOutput(); err != nil {
		t.Fatalf("restore from the new cluster's log store to LSN %d: %v\n%s", upto, err, out)
	}
	np3.stop()
	ls3.stop()

	// Pointed at the source's log store, a restored directory is refused:
	// it is another cluster, never mistaken for the source.
	dir2 := filepath.Join(t.TempDir(), "restored2")
	_, newID, _ := strings.Cut(field(restore("--data-dir", dir2, "--latest"), "data dir"), ", new cluster ")
	lsStatus, err := walshipv1.NewLogStoreServiceClient(ls.dial(ctx)).Status(ctx, &walshipv1.LogStoreServiceStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if newID == "" || lsStatus.ClusterId == "" || newID == lsStatus.ClusterId {
		t.Fatalf("restored cluster %q, source cluster %q: want two ids", newID, lsStatus.ClusterId)
	}
	cmd := exec.Command(walshipBin(t), "primary", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", dir2, "--logstore", ls.addr, "--log-format", "json")
	cmd.Env = cleanEnv()
	out, err = func() (string, error) { b, err := cmd.CombinedOutput(); return string(b), err }()
	if err == nil || !strings.Contains(out, "cluster id mismatch") || !strings.Contains(out, newID) || !strings.Contains(out, lsStatus.ClusterId) {
		t.Fatalf("a restored primary against the source's log store: %v; want it refused naming clusters %s and %s:\n%s", err, newID, lsStatus.ClusterId, out)
	}
}

// field is the value of a "name   value" line of walship's table output.
func field(out, name string) string {
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}
