package restore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/restore"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
	"github.com/walship/walship/services/logstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// BenchmarkRestore measures a restore from a real log store on loopback,
// as from a log store's archive: a base snapshot of 200,000 keys, then
// WALSHIP_RESTORE_BENCH_MB of WAL payload after it (256 by default; 1024
// for 1 GiB), in batches of about 256 KiB of puts of 100-byte values over
// those keys, as a busy primary writes them. The WAL is written straight
// into the log store's directory and the snapshot uploaded with
// PutSnapshot. It reports the WAL bytes replayed per second (replay_MB/s:
// reading, checking, decoding and applying) and the whole restore
// (restore_s: also reading the snapshot, and writing the state's snapshot
// and fsyncing it).
func BenchmarkRestore(b *testing.B) {
	mb := 256
	if s := os.Getenv("WALSHIP_RESTORE_BENCH_MB"); s != "" {
		var err error
		if mb, err = strconv.Atoi(s); err != nil {
			b.Fatalf("WALSHIP_RESTORE_BENCH_MB=%q: %v", s, err)
		}
	}
	dir := b.TempDir()
	base, payload := fillLogStore(b, dir, int64(mb)<<20, 100, 200000)
	addr := runLogStore(b, dir)
	putSnapshot(b, addr, base)
	b.SetBytes(payload)
	b.ResetTimer()
	var mbps, took float64
	for range b.N {
		res, err := restore.Run(context.Background(), restore.Options{LogStores: []string{addr}, DataDir: filepath.Join(b.TempDir(), "r"), Target: restore.AtLatest()})
		if err != nil {
			b.Fatal(err)
		}
		if res.Snapshot == nil || res.Snapshot.Lsn != base.AppliedLSN() {
			b.Fatalf("the restore started from %v, not the snapshot at LSN %d", res.Snapshot, base.AppliedLSN())
		}
		mbps += res.ReplayMBps()
		took += res.Took.Seconds()
	}
	b.ReportMetric(mbps/float64(b.N), "replay_MB/s")
	b.ReportMetric(took/float64(b.N), "restore_s")
}

// fillLogStore writes a log store's WAL and epoch history directly: epoch
// 1, first a put of every key (the base a snapshot is taken of), then
// batches of ~256 KiB of puts (valueBytes each, keys drawn from keys),
// total payload bytes after the base. It returns the state at the end of
// the base and the payload bytes written after it.
func fillLogStore(b *testing.B, dir string, total int64, valueBytes, keys int) (*state.View, int64) {
	b.Helper()
	log, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal"), SegmentSize: logstore.DefaultSegmentBytes})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	value := make([]byte, valueBytes)
	var written int64
	var batch codec.Batch
	var buf []byte
	lsn := uint64(1)
	start := time.Now().Add(-time.Hour)
	baseState := state.New()
	rp := state.NewReplayer(baseState)
	next := 0 // the base puts every key once, in order
	var base *state.View
	for n := 0; written < total; n++ {
		batch.Reset()
		size := 0
		for size < 256<<10 {
			// Transactions of 4 puts and a commit.
			txn := lsn
			for range 4 {
				k := next
				if base != nil {
					k = rng.IntN(keys)
				}
				next = min(next+1, keys-1)
				key := []byte(fmt.Sprintf("k%08d", k))
				batch.Records = append(batch.Records, codec.Record{LSN: lsn, TxnID: txn, Op: codec.OpPut, Key: key, Value: value})
				lsn++
				size += len(key) + len(value) + 16
			}
			batch.Records = append(batch.Records, codec.Record{LSN: lsn, TxnID: txn, Op: codec.OpCommit})
			lsn++
		}
		buf, err = codec.MsgPack.AppendBatch(buf[:0], &batch)
		if err != nil {
			b.Fatal(err)
		}
		env := &walshipv1.WalBatch{Epoch: 1, FirstLsn: batch.FirstLSN(), LastLsn: batch.LastLSN(), PrevLsn: batch.FirstLSN() - 1,
			CommitTimeUnixNano: start.Add(time.Duration(n) * time.Millisecond).UnixNano(), Codec: walshipv1.Codec(codec.MsgPack.ID()),
			Payload: buf, Crc32C: codec.Checksum(buf)}
		data, err := envelope.Marshal(env)
		if err != nil {
			b.Fatal(err)
		}
		if err := log.Append(wal.Entry{FirstLSN: env.FirstLsn, LastLSN: env.LastLsn, Data: data}); err != nil {
			b.Fatal(err)
		}
		if base != nil {
			written += int64(len(buf))
			continue
		}
		if err := rp.Apply(&batch); err != nil {
			b.Fatal(err)
		}
		if next == keys-1 {
			base = rp.Finish().Snapshot()
		}
	}
	if err := log.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := log.Close(); err != nil {
		b.Fatal(err)
	}
	if err := datadir.SaveHistory(vfs.OS, dir, datadir.History{{Epoch: 1, FirstLSN: 1}}); err != nil {
		b.Fatal(err)
	}
	return base, written
}

// putSnapshot uploads v to the log store at addr as a base snapshot.
func putSnapshot(b *testing.B, addr string, v *state.View) {
	b.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	st, err := walshipv1.NewLogStoreServiceClient(cc).PutSnapshot(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	send := func(m *walshipv1.PutSnapshotRequest) {
		if err := st.Send(m); err != nil {
			b.Fatal(err)
		}
	}
	send(&walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Header{Header: &walshipv1.SnapshotHeader{
		Epoch: 1, Lsn: v.AppliedLSN(), Keys: uint64(v.Len()), History: []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}}}}})
	var kvs []*walshipv1.KeyValue
	v.Scan(nil, nil, 0, func(k, val []byte, ver uint64) bool {
		kvs = append(kvs, &walshipv1.KeyValue{Key: string(k), Value: val, VersionLsn: ver})
		if len(kvs) == 4096 {
			send(&walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Chunk{Chunk: &walshipv1.SnapshotChunk{Kvs: kvs}}})
			kvs = nil
		}
		return true
	})
	if len(kvs) > 0 {
		send(&walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Chunk{Chunk: &walshipv1.SnapshotChunk{Kvs: kvs}}})
	}
	send(&walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Trailer{Trailer: &walshipv1.SnapshotTrailer{StateDigest: v.Digest().String()}}})
	if _, err := st.CloseAndRecv(); err != nil {
		b.Fatal(err)
	}
}

// runLogStore serves the log store in dir until the benchmark ends.
func runLogStore(b *testing.B, dir string) string {
	b.Helper()
	cfg := logstore.DefaultConfig()
	cfg.Listen, cfg.MetricsListen, cfg.DataDir, cfg.RetentionBytes = "127.0.0.1:0", "", dir, 0
	s, err := logstore.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})
	return s.Addr()
}
