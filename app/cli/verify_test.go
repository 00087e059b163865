package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
	"github.com/walship/walship/services/logstore"
)

// fillLogStore writes n one-transaction batches (LSNs 1..2n) into a log
// store's WAL in dir; damage(i, b) may spoil batch i first.
func fillLogStore(t *testing.T, dir string, n int, damage func(int, *walshipv1.WalBatch)) {
	t.Helper()
	log, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal")})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		lsn := uint64(2*i + 1)
		payload, err := codec.MsgPack.AppendBatch(nil, &codec.Batch{Records: []codec.Record{
			{LSN: lsn, TxnID: lsn, Op: codec.OpPut, Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")},
			{LSN: lsn + 1, TxnID: lsn, Op: codec.OpCommit}}})
		if err != nil {
			t.Fatal(err)
		}
		b := &walshipv1.WalBatch{Epoch: 1, FirstLsn: lsn, LastLsn: lsn + 1, PrevLsn: lsn - 1, CommitTimeUnixNano: 1,
			Codec: walshipv1.Codec_CODEC_MSGPACK, Payload: payload, Crc32C: codec.Checksum(payload)}
		if damage != nil {
			damage(i, b)
		}
		data, err := envelope.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := log.Append(wal.Entry{FirstLSN: lsn, LastLSN: lsn + 1, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
}

// serveLogStore runs a log store on dir, with peers, until the test ends.
func serveLogStore(t *testing.T, dir string, peers ...string) string {
	t.Helper()
	cfg := logstore.DefaultConfig()
	cfg.Listen, cfg.MetricsListen, cfg.DataDir, cfg.Peers = "127.0.0.1:0", "", dir, peers
	cfg.Registry = prometheus.NewRegistry()
	cfg.StopTimeout = 5 * time.Second
	s, err := logstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return s.Addr()
}

// TestCtlVerify runs `walship ctl verify` against real log stores: a
// sound archive prints its range and exits 0; a damaged one, an empty one
// (nothing restorable) and an unreachable one exit 1, each named.
func TestCtlVerify(t *testing.T) {
	good := t.TempDir()
	fillLogStore(t, good, 5, nil)
	if err := datadir.SaveHistory(vfs.OS, good, datadir.History{{Epoch: 1, FirstLSN: 1}}); err != nil {
		t.Fatal(err)
	}
	bad := t.TempDir()
	fillLogStore(t, bad, 5, func(i int, b *walshipv1.WalBatch) {
		if i == 3 {
			b.Crc32C ^= 1
		}
	})
	goodAddr, badAddr, emptyAddr := serveLogStore(t, good), serveLogStore(t, bad), serveLogStore(t, t.TempDir())

	code, out, errOut := run(t, "ctl", "verify", "--logstore", goodAddr)
	out = oneSpaced(out)
	if code != 0 {
		t.Fatalf("sound archive: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{"log store " + goodAddr, "log LSNs 1..10, 5 batches", "epochs 1 from LSN 1", "snapshots none stored yet", "restorable LSNs 0..10", "problems none"} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not mention %q:\n%s", want, out)
		}
	}

	code, out, errOut = run(t, "ctl", "verify", "--logstore", strings.Join([]string{goodAddr, badAddr, emptyAddr, "127.0.0.1:1"}, ","), "--timeout", "5s")
	out = oneSpaced(out)
	if code != 1 {
		t.Fatalf("damaged archives: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{"restorable LSNs 0..6", "problems 1", "KIND LSN WHAT crc 7 segment 0000000000000001.wal, LSNs 7..8: ", "crc32c mismatch",
		"log store " + emptyAddr + " log empty", "restorable nothing", "127.0.0.1:1: cannot verify"} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not mention %q:\n%s", want, out)
		}
	}
	for _, want := range []string{badAddr + ": 1 problems", emptyAddr + ": nothing restorable", "127.0.0.1:1: "} {
		if !strings.Contains(errOut, want) {
			t.Errorf("the error does not mention %q:\n%s", want, errOut)
		}
	}
	if strings.Contains(errOut, goodAddr) {
		t.Errorf("the error names the sound log store:\n%s", errOut)
	}

	if code, _, errOut := run(t, "ctl", "verify"); code != 2 || !strings.Contains(errOut, "--logstore or --archive") {
		t.Fatalf("without --logstore or --archive: exit %d, %q", code, errOut)
	}
}

// oneSpaced turns every run of white space in s into one space.
func oneSpaced(s string) string { return strings.Join(strings.Fields(s), " ") }
