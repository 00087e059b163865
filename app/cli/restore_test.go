package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
)

// runHint runs the printed command `walship args...` until the returned
// stop is called, and returns once its log says servingMsg; stop cancels
// it and fails the test unless it then exits 0.
func runHint(t *testing.T, args []string, servingMsg string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := &testkit.Output{}, &testkit.Output{}
	code := make(chan int, 1)
	go func() { code <- Main(ctx, args, out, errOut) }()
	exited := false
	stop = func() {
		t.Helper()
		cancel()
		if exited {
			return
		}
		exited = true
		if c := <-code; c != 0 {
			t.Errorf("walship %s: exit %d after a stop\n%s", strings.Join(args, " "), c, errOut.String())
		}
	}
	t.Cleanup(stop)
	testkit.UntilWithin(t, 30*time.Second, "walship "+strings.Join(args, " ")+" to serve", func() bool {
		select {
		case c := <-code:
			exited = true
			t.Fatalf("walship %s: exit %d, as printed\n%s%s", strings.Join(args, " "), c, out.String(), errOut.String())
		default:
		}
		return strings.Contains(errOut.String(), servingMsg)
	})
	return stop
}

// TestRestoreHintsRunAsPrinted: the commands walship restore prints to
// start what it restored run as printed next to walship dev's nodes —
// with an --id, and gRPC and metrics ports nothing else holds — and serve
// the restored state: the read-only node reads it, the new cluster's
// primary reads it and takes writes after it.
func TestRestoreHintsRunAsPrinted(t *testing.T) {
	d := startDev(t, "--replicas", "1")
	ctx := t.Context()
	put, err := walshipv1.NewKVServiceClient(devConn(t, d.node(t, "primary"))).Put(ctx, &walshipv1.PutRequest{Key: "hello", Value: []byte("world"),
		Policy: &walshipv1.CommitPolicy{Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC}}) // so that --latest reaches it
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "asof")
	code, out, errOut := run(t, "restore", "--logstore", d.node(t, "logstore-0"), "--latest", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("restore: exit %d\n%s%s", code, out, errOut)
	}
	for _, tc := range []struct{ prefix, serving string }{
		{"walship replica --read-only", "replica serving"},
		{"walship primary", "primary serving"},
	} {
		args := hintIn(t, out, tc.prefix)
		if got := flagValue(t, args, "data-dir"); got != dir {
			t.Fatalf("%s: --data-dir %s, want %s", tc.prefix, got, dir)
		}
		stop := runHint(t, args, tc.serving)
		kv := walshipv1.NewKVServiceClient(devConn(t, flagValue(t, args, "listen")))
		got, err := kv.Get(ctx, &walshipv1.GetRequest{Key: "hello"})
		if err != nil || string(got.GetValue()) != "world" || got.GetVersionLsn() != put.GetLsn() {
			t.Fatalf("%s: Get hello = %v, %v; want world at LSN %d", tc.prefix, got, err, put.GetLsn())
		}
		if tc.prefix == "walship primary" {
			if r, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "after", Value: []byte("v")}); err != nil || r.GetLsn() <= put.GetLsn() {
				t.Fatalf("Put on the restored primary = %v, %v; want an LSN after %d", r, err, put.GetLsn())
			}
		}
		stop()
	}
}

// TestRestoreNewClusterHintsRunAsPrinted: walship restore --members
// writes the new cluster's first epoch, and the commands it prints start
// that cluster — its primary on the restored directory with new ids and a
// new, empty log store, and its replica — which opens and takes writes
// that wait for the replica, where the old cluster's contract (the dev
// cluster's primary and replica-0, which never come) kept it waiting.
func TestRestoreNewClusterHintsRunAsPrinted(t *testing.T) {
	d := startDev(t, "--replicas", "1")
	ctx := t.Context()
	put, err := walshipv1.NewKVServiceClient(devConn(t, d.node(t, "primary"))).Put(ctx, &walshipv1.PutRequest{Key: "hello", Value: []byte("world"),
		Policy: &walshipv1.CommitPolicy{Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC}})
	if err != nil {
		t.Fatal(err)
	}
	ls, n0, n1 := testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
	runHint(t, []string{"logstore", "--listen", ls, "--data-dir", t.TempDir(), "--metrics-listen", testkit.FreeAddr(t)}, "log store serving")
	dir := filepath.Join(t.TempDir(), "new")
	code, out, errOut := run(t, "restore", "--logstore", d.node(t, "logstore-0"), "--latest", "--data-dir", dir,
		"--members", "n0="+n0+",n1="+n1, "--new-logstore", ls, "--replication", "sync", "--sync-replicas", "1", "--logstore-ack", "sync")
	if code != 0 {
		t.Fatalf("restore: exit %d\n%s%s", code, out, errOut)
	}
	p := hintIn(t, out, "walship primary")
	if got := flagValue(t, p, "data-dir"); got != dir {
		t.Fatalf("walship primary: --data-dir %s, want %s", got, dir)
	}
	runHint(t, p, "primary serving")
	r := hintIn(t, out, "walship replica")
	for i, a := range r {
		if a == "EMPTY-DIR" {
			r[i] = t.TempDir()
		}
	}
	runHint(t, r, "replica serving")
	kv := walshipv1.NewKVServiceClient(devConn(t, n0))
	testkit.UntilWithin(t, 30*time.Second, "the new cluster's primary to take a write its replica acknowledges", func() bool {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		r, err := kv.Put(c, &walshipv1.PutRequest{Key: "after", Value: []byte("v"),
			Policy: &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncReplicas: 1}})
		return err == nil && r.GetLsn() > put.GetLsn()
	})
	if got, err := kv.Get(ctx, &walshipv1.GetRequest{Key: "hello"}); err != nil || string(got.GetValue()) != "world" {
		t.Fatalf("Get hello = %v, %v; want world", got, err)
	}
}

// TestRestoreNewClusterFlagsRefused: the new cluster's contract flags
// need --members, and a contract that cannot be is refused, naming the
// flag, before anything is read or written.
func TestRestoreNewClusterFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sync-replicas", "1"}, "--sync-replicas: only with --members"},
		{[]string{"--new-logstore", "127.0.0.1:1"}, "--new-logstore: only with --members"},
		{[]string{"--members", "n0=127.0.0.1:1", "--replication", "sync", "--sync-replicas", "1"}, "--sync-replicas: 1, but --members names 0"},
		{[]string{"--members", "n0=127.0.0.1:1,n0=127.0.0.1:2"}, "--members: n0 is named twice"},
		{[]string{"--members", "n0=127.0.0.1:1", "--logstore-ack", "sync"}, "--logstore-ack sync: needs the new cluster's log stores"},
		{[]string{"--members", "n0=127.0.0.1:1", "--new-logstore", "127.0.0.1:9"}, "--new-logstore: 127.0.0.1:9 is one of the log stores restored from"},
	} {
		dir := filepath.Join(t.TempDir(), "d")
		args := append([]string{"restore", "--logstore", "127.0.0.1:9", "--latest", "--data-dir", dir}, tc.args...)
		code, out, errOut := run(t, args...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("walship %s: exit %d\n%s%s\nwant an error naming %q", strings.Join(args, " "), code, out, errOut, tc.want)
		}
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("walship %s: made %s", strings.Join(args, " "), dir)
		}
	}
}

// TestRestoreAfterMembershipChangeHintRunsAsPrinted: the primary walship
// restore prints for a directory restored without --members starts too
// when the cluster restored from had changed its members at run time
// (walship ctl members remove), as it does for one that never had.
//
// The restored log's members were changed at run time, so they would win
// over --peers and a primary without --peers refuses them: the restore
// writes the printed primary's new cluster of one instead
// (restore.Options.NewClusterIfChanged). Seen failing without it: the
// printed primary exited 1.
func TestRestoreAfterMembershipChangeHintRunsAsPrinted(t *testing.T) {
	d := startDev(t, "--replicas", "2")
	ctx := t.Context()
	code, out, errOut := run(t, "ctl", "members", "remove", "--member", "replica-1", "--nodes", d.node(t, "primary"))
	if code != 0 || !strings.Contains(out, "membership change done") {
		t.Fatalf("remove replica-1: exit %d\n%s%s", code, out, errOut)
	}
	put, err := walshipv1.NewKVServiceClient(devConn(t, d.node(t, "primary"))).Put(ctx, &walshipv1.PutRequest{Key: "hello", Value: []byte("world"),
		Policy: &walshipv1.CommitPolicy{Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC}}) // so that --latest reaches it
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "asof")
	if code, out, errOut := run(t, "restore", "--logstore", d.node(t, "logstore-0"), "--latest", "--data-dir", dir); code != 0 {
		t.Fatalf("restore: exit %d\n%s%s", code, out, errOut)
	} else {
		args := hintIn(t, out, "walship primary")
		stop := runHint(t, args, "primary serving")
		defer stop()
		got, err := walshipv1.NewKVServiceClient(devConn(t, flagValue(t, args, "listen"))).Get(ctx, &walshipv1.GetRequest{Key: "hello"})
		if err != nil || string(got.GetValue()) != "world" || got.GetVersionLsn() != put.GetLsn() {
			t.Fatalf("Get hello = %v, %v; want world at LSN %d", got, err, put.GetLsn())
		}
	}
}
