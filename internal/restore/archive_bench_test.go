package restore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/restore"
	"github.com/walship/walship/internal/s3test"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/services/logstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The archive's benchmarks run against a real S3-compatible server on
// loopback (SeaweedFS; bin/weed, `make seaweedfs`), with the log store's
// WAL written as BenchmarkRestore writes it: WALSHIP_RESTORE_BENCH_MB of
// payload (256 by default) in batches of about 256 KiB.
//
//	go test -run '^$' -bench 'Archive' -benchtime 1x -count 6 ./internal/restore/

const benchCluster = "0b0b0b0b-1111-4222-8333-444444444444"

func benchMB(b *testing.B) int {
	mb := 256
	if s := os.Getenv("WALSHIP_RESTORE_BENCH_MB"); s != "" {
		var err error
		if mb, err = strconv.Atoi(s); err != nil {
			b.Fatalf("WALSHIP_RESTORE_BENCH_MB=%q: %v", s, err)
		}
	}
	return mb
}

// archivingLogStore serves the log store in dir with an archive at cfg.
func archivingLogStore(b *testing.B, dir string, cfg archive.Config) (*logstore.Server, func()) {
	b.Helper()
	lc := logstore.DefaultConfig()
	lc.Listen, lc.MetricsListen, lc.DataDir, lc.RetentionBytes = "127.0.0.1:0", "", dir, 0
	lc.Archive = logstore.ArchiveOptions{Config: cfg, Interval: 10 * time.Millisecond}
	s, err := logstore.New(lc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return s, func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}
}

// askToArchive plays the primary: it opens an Append stream whose
// heartbeats name the log store the uploader, with everything durable at
// a majority, and keeps them coming until the archive holds durable.
func askToArchive(b *testing.B, addr string, durable uint64) time.Duration {
	b.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	ls := walshipv1.NewLogStoreServiceClient(cc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := ls.Append(ctx)
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Minute)
	for {
		if err := st.Send(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: 1, LastLsn: durable, TimeUnixNano: time.Now().UnixNano(),
			PrimaryId: "bench", ClusterId: benchCluster, Archiver: true, LogstoreQuorumLsn: durable}}); err != nil {
			b.Fatal(err)
		}
		s, err := ls.Status(ctx, &walshipv1.LogStoreServiceStatusRequest{})
		if err != nil {
			b.Fatal(err)
		}
		if s.GetArchive().GetArchivedLsn() >= durable {
			return time.Since(start)
		}
		if e := s.GetArchive().GetError(); e != "" {
			b.Fatalf("archive: %s", e)
		}
		select {
		case <-tick.C:
		case <-deadline:
			b.Fatalf("the archive holds LSN %d of %d after 10 minutes", s.GetArchive().GetArchivedLsn(), durable)
		}
	}
}

func benchS3(b *testing.B) (*s3test.Server, func(prefix string) archive.Config) {
	srv := s3test.Start(b, "walship")
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		b.Setenv(k, v)
	}
	return srv, func(prefix string) archive.Config {
		return archive.Config{URL: "s3://walship/" + prefix, Endpoint: srv.Endpoint, PathStyle: true}
	}
}

// BenchmarkArchiveUpload measures the uploader: a log store holding the
// WAL is asked to archive it and uploads it all, in 16 MiB chunks, four
// at a time. archive_MB/s is the WAL payload archived per second.
func BenchmarkArchiveUpload(b *testing.B) {
	mb := benchMB(b)
	_, cfgOf := benchS3(b)
	src := b.TempDir()
	_, payload := fillLogStore(b, src, int64(mb)<<20, 100, 200000)
	b.SetBytes(payload)
	b.ResetTimer()
	var mbps float64
	for i := range b.N {
		b.StopTimer()
		dir := filepath.Join(b.TempDir(), "ls")
		if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
			b.Fatal(err)
		}
		s, stop := archivingLogStore(b, dir, cfgOf(fmt.Sprintf("upload-%d-%d", time.Now().UnixNano(), i)))
		durable := s.Status().GetDurableLsn()
		b.StartTimer()
		took := askToArchive(b, s.Addr(), durable)
		b.StopTimer()
		stop()
		mbps += float64(payload) / 1e6 / took.Seconds()
	}
	b.ReportMetric(mbps/float64(b.N), "archive_MB/s")
}

// BenchmarkRestoreFromArchive measures a restore from the bucket alone: a
// base snapshot of 200,000 keys and the WAL after it, archived once, then
// restored to the latest LSN. replay_MB/s as BenchmarkRestore's.
func BenchmarkRestoreFromArchive(b *testing.B) {
	mb := benchMB(b)
	_, cfgOf := benchS3(b)
	dir := b.TempDir()
	base, payload := fillLogStore(b, dir, int64(mb)<<20, 100, 200000)
	cfg := cfgOf(fmt.Sprintf("restore-%d", time.Now().UnixNano()))
	s, stop := archivingLogStore(b, dir, cfg)
	putSnapshot(b, s.Addr(), base)
	askToArchive(b, s.Addr(), s.Status().GetDurableLsn())
	// The snapshot goes up after the chunks, in the same round or the next.
	a, err := archive.Open(context.Background(), cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	testkit.UntilWithin(b, time.Minute, "the snapshot in the archive", func() bool {
		cat, err := a.Catalog(context.Background(), "")
		return err == nil && len(cat.Snapshots) > 0
	})
	stop()
	b.SetBytes(payload)
	b.ResetTimer()
	var mbps, took float64
	for range b.N {
		res, err := restore.Run(context.Background(), restore.Options{Archive: a, DataDir: filepath.Join(b.TempDir(), "r"), Target: restore.AtLatest()})
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
