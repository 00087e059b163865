package recovery

import (
	"fmt"
	"path/filepath"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
)

// writeTxns writes n one-put transactions (2 LSNs each) to dir's WAL.
func writeTxns(t *testing.T, fs vfs.FS, dir string, n int) {
	t.Helper()
	log, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal"), FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		first := uint64(2*i + 1)
		b := codec.Batch{Records: []codec.Record{
			{LSN: first, TxnID: first + 1, Op: codec.OpPut, Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte("v")},
			{LSN: first + 1, TxnID: first + 1, Op: codec.OpCommit},
		}}
		payload, err := codec.MsgPack.AppendBatch(nil, &b)
		if err != nil {
			t.Fatal(err)
		}
		data, err := envelope.Marshal(&walshipv1.WalBatch{Epoch: 1, FirstLsn: first, LastLsn: first + 1, PrevLsn: first - 1,
			Codec: walshipv1.Codec_CODEC_MSGPACK, Payload: payload, Crc32C: codec.Checksum(payload)})
		if err != nil {
			t.Fatal(err)
		}
		if err := log.Append(wal.Entry{FirstLSN: first, LastLSN: first + 1, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestLimitReplay: with LimitReplay, batches past the limit are returned
// unapplied, in order, and stay in the log; without it everything is applied.
func TestLimitReplay(t *testing.T) {
	fs := vfs.NewMem()
	writeTxns(t, fs, "/d", 5) // LSNs 1..10
	for _, tc := range []struct {
		limit       bool
		upTo        uint64
		applied     uint64
		pendingFrom []uint64
	}{
		{false, 0, 10, nil},
		{true, 0, 0, []uint64{1, 3, 5, 7, 9}},
		{true, 4, 4, []uint64{5, 7, 9}},
		{true, 5, 4, []uint64{5, 7, 9}}, // inside a batch: the batch waits
		{true, 10, 10, nil},
		{true, 99, 10, nil},
	} {
		res, err := Open(Options{DataDir: "/d", FS: fs, LimitReplay: tc.limit, ReplayUpTo: tc.upTo})
		if err != nil {
			t.Fatal(err)
		}
		var from []uint64
		for _, e := range res.Pending {
			from = append(from, e.FirstLSN)
		}
		if res.Store.AppliedLSN() != tc.applied || fmt.Sprint(from) != fmt.Sprint(tc.pendingFrom) || res.WAL.LastLSN() != 10 {
			t.Errorf("limit %v up to %d: applied %d, pending from %v, WAL last %d; want applied %d, pending from %v, WAL last 10",
				tc.limit, tc.upTo, res.Store.AppliedLSN(), from, res.WAL.LastLSN(), tc.applied, tc.pendingFrom)
		}
		if err := res.WAL.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPendingDataIsBounded: pending entries carry their Data only up to
// PendingDataBytes; the rest come with LSNs only, so a replica whose log
// ends in a long undurable tail does not load it all into memory.
func TestPendingDataIsBounded(t *testing.T) {
	fs := vfs.NewMem()
	writeTxns(t, fs, "/d", 5) // LSNs 1..10
	all, err := Open(Options{DataDir: "/d", FS: fs, LimitReplay: true, PendingDataBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	size := int64(len(all.Pending[0].Data) + len(all.Pending[1].Data)) // room for the first two
	if err := all.WAL.Close(); err != nil {
		t.Fatal(err)
	}
	res, err := Open(Options{DataDir: "/d", FS: fs, LimitReplay: true, PendingDataBytes: size})
	if err != nil {
		t.Fatal(err)
	}
	defer res.WAL.Close()
	var got []string
	for _, e := range res.Pending {
		got = append(got, fmt.Sprintf("%d-%d:%v", e.FirstLSN, e.LastLSN, e.Data != nil))
	}
	if want := "[1-2:true 3-4:true 5-6:false 7-8:false 9-10:false]"; fmt.Sprint(got) != want || size == 0 {
		t.Fatalf("pending %v, want %s (bound %d)", got, want, size)
	}
}

// TestOpenReportsSnapshotSize: Open reports the loaded snapshot's file size
// (what sizes the next snapshot interval), and 0 without a snapshot.
func TestOpenReportsSnapshotSize(t *testing.T) {
	fs := vfs.NewMem()
	dir := "/data"
	writeTxns(t, fs, dir, 3)
	res, err := Open(Options{DataDir: dir, FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	if res.SnapshotPath != "" || res.SnapshotBytes != 0 {
		t.Fatalf("no snapshot yet: path %q, bytes %d", res.SnapshotPath, res.SnapshotBytes)
	}
	path, err := state.SaveSnapshot(fs, SnapshotDir(dir), res.Store.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := res.WAL.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := vfs.ReadFile(fs, path)
	if err != nil {
		t.Fatal(err)
	}
	res, err = Open(Options{DataDir: dir, FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer res.WAL.Close()
	if res.SnapshotPath != path || res.SnapshotBytes != int64(len(data)) || res.SnapshotBytes == 0 {
		t.Fatalf("path %q, bytes %d; want %q, %d", res.SnapshotPath, res.SnapshotBytes, path, len(data))
	}
	if FileSize(fs, path+".missing") != 0 || FileSize(fs, "") != 0 {
		t.Fatal("FileSize of a missing file is not 0")
	}
}
