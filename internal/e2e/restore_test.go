package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
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
