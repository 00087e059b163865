package cli

import (
	"context"
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
