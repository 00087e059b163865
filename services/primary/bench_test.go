package primary

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/cpustat"
	"github.com/walship/walship/internal/kvpipe"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// BenchmarkCommit measures commits through the real gRPC server on
// loopback into a WAL on the real disk, with 1, 8 and 64 concurrent
// committers, and reports commits/s, commits per fsync (group commit), the
// mean duration of the WAL's fsyncs (µs/fsync) and the share of the run
// spent in them (fsync_busy).
// With durability sync it also measures the disk's own rate for one 4 KiB
// append+fdatasync (internal/wal's BenchmarkDiskFdatasync) on the same
// filesystem just before and just after the run, and reports their mean
// (disk_appends/s) and commits/s over it (x_disk): the disk's speed drifts
// 2× within minutes here, so a ratio is only fair against the disk of the
// same minute.
func BenchmarkCommit(b *testing.B) {
	for _, durability := range []walshipv1.Durability{walshipv1.Durability_DURABILITY_SYNC, walshipv1.Durability_DURABILITY_ASYNC} {
		for _, committers := range []int{1, 8, 64} {
			name := fmt.Sprintf("durability=%s/committers=%d", durabilityLabel(durability), committers)
			b.Run(name, func(b *testing.B) { benchCommit(b, durability, committers) })
		}
	}
}

// startBench runs a primary with the given default durability, without
// replication, on loopback and a real disk, until the benchmark ends.
func startBench(b *testing.B, durability walshipv1.Durability, adjust ...func(*Config)) *Server {
	b.Helper()
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.DataDir = b.TempDir()
	cfg.Policy.Durability = durability
	cfg.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED
	for _, a := range adjust {
		a(&cfg)
	}
	s, err := New(cfg)
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
	// Run opens the epoch in the background: a Put before then is refused.
	testkit.Until(b, "the primary to take writes", s.TakingWrites)
	return s
}

func benchCommit(b *testing.B, durability walshipv1.Durability, committers int) {
	s := startBench(b, durability)
	cfg := s.cfg
	// One connection, as an application holds one gRPC ClientConn; its
	// streams multiplex the committers.
	conn := dialBench(b, s.Addr())
	defer conn.Close()
	kv := walshipv1.NewKVServiceClient(conn)
	var diskBefore float64
	if durability == walshipv1.Durability_DURABILITY_SYNC {
		diskBefore = diskAppendRate(b, cfg.DataDir)
	}
	st0, n0 := s.wal.Stats(), b.N
	rate := putLoop(b, kv, committers, "commits/s")
	st := s.wal.Stats()
	syncs := st.Syncs - st0.Syncs
	if syncs > 0 {
		b.ReportMetric(float64(n0)/float64(syncs), "commits/fsync")
		// How long one fsync of the WAL takes, and the share of the run
		// the syncer spent in fsyncs: the rest of each group's cycle is
		// the clients' round trip.
		took := st.SyncDuration - st0.SyncDuration
		b.ReportMetric(float64(took.Microseconds())/float64(syncs), "µs/fsync")
		b.ReportMetric(took.Seconds()*rate/float64(n0), "fsync_busy")
	}
	// Entries are what replicas and log stores receive one message each.
	if entries := st.EntriesAppended - st0.EntriesAppended; entries > 0 {
		b.ReportMetric(float64(n0)/float64(entries), "commits/entry")
	}
	if diskBefore > 0 {
		disk := (diskBefore + diskAppendRate(b, cfg.DataDir)) / 2
		b.ReportMetric(disk, "disk_appends/s")
		b.ReportMetric(rate/disk, "x_disk")
	}
}

// BenchmarkCommitPipelined is BenchmarkCommit's async run with the
// committers' Puts sent on one Pipeline stream, as pkg/client sends
// concurrent calls (kvpipe.Mux): the primary runs the writes a message
// carries as one group. cpu_µs/op is the process's, client included.
func BenchmarkCommitPipelined(b *testing.B) {
	for _, committers := range []int{8, 64} {
		b.Run(fmt.Sprintf("committers=%d", committers), func(b *testing.B) {
			b.ReportAllocs()
			s := startBench(b, walshipv1.Durability_DURABILITY_ASYNC)
			conn := dialBench(b, s.Addr())
			defer conn.Close()
			m := kvpipe.NewMux(walshipv1.NewKVServiceClient(conn))
			defer m.Close()
			putLoop(b, m, committers, "commits/s")
		})
	}
}

// BenchmarkCommitTLS is BenchmarkCommit's 8 committers in plaintext and
// over mTLS (TLS 1.3, client certificates, the default authorization
// policy on every call): what security costs a commit.
func BenchmarkCommitTLS(b *testing.B) {
	for _, durability := range []walshipv1.Durability{walshipv1.Durability_DURABILITY_SYNC, walshipv1.Durability_DURABILITY_ASYNC} {
		for _, withTLS := range []bool{false, true} {
			b.Run(fmt.Sprintf("durability=%s/tls=%v", durabilityLabel(durability), withTLS), func(b *testing.B) {
				var sec serve.Security
				if withTLS {
					sec = benchTLS(b)
				}
				s := startBench(b, durability, func(c *Config) { c.Security = sec })
				conn := dialBenchWith(b, sec.Dialer, s.Addr())
				defer conn.Close()
				kv := walshipv1.NewKVServiceClient(conn)
				testkit.Until(b, "the primary to open its epoch", func() bool {
					_, err := kv.Put(context.Background(), &walshipv1.PutRequest{Key: "warm", Value: []byte("x")})
					return err == nil
				})
				putLoop(b, kv, 8, "commits/s")
			})
		}
	}
}

// benchTLS makes a CA and a node certificate and returns the server's
// security, whose Dialer the benchmark's clients dial with.
func benchTLS(b *testing.B) serve.Security {
	b.Helper()
	ca, err := tlsid.NewCA("bench", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	f, err := ca.WriteFiles(b.TempDir(), "n", tlsid.Leaf{URI: tlsid.URI("bench", tlsid.ClassAdmin, "n"), IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		b.Fatal(err)
	}
	src, err := tlsid.Load(f, nil)
	if err != nil {
		b.Fatal(err)
	}
	az, err := tlsid.NewAuthz(tlsid.AuthzConfig{TrustDomain: "bench", Reflection: tlsid.ReflectionAll})
	if err != nil {
		b.Fatal(err)
	}
	return serve.Security{TLS: src, Authz: az, Dialer: serve.NewDialer(src, "")}
}

// BenchmarkCommitDistant is BenchmarkCommit's 7 sync committers, alone or
// beside one distant client on a connection of its own whose every next
// commit comes `distant` after its last one was acknowledged (a client in
// another zone, or one that thinks between commits). It reports the 7's
// commits/s: a group commit that waited for the distant client's next
// commit each time it had just been acknowledged would cost them a gather
// window per distant commit.
func BenchmarkCommitDistant(b *testing.B) {
	for _, distant := range []time.Duration{0, 2 * time.Millisecond} {
		b.Run(fmt.Sprintf("distant=%v", distant), func(b *testing.B) {
			s := startBench(b, walshipv1.Durability_DURABILITY_SYNC)
			conn := dialBench(b, s.Addr())
			defer conn.Close()
			var far sync.WaitGroup
			stop := make(chan struct{})
			var farCommits atomic.Int64
			if distant > 0 {
				farConn := dialBench(b, s.Addr())
				defer farConn.Close()
				farKV := walshipv1.NewKVServiceClient(farConn)
				far.Go(func() {
					t := time.NewTimer(distant)
					defer t.Stop()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						case <-t.C:
						}
						if _, err := farKV.Put(context.Background(), &walshipv1.PutRequest{Key: fmt.Sprintf("far/%d", i), Value: []byte("x")}); err != nil {
							b.Error(err)
							return
						}
						farCommits.Add(1)
						t.Reset(distant)
					}
				})
			}
			st0, n0 := s.wal.Stats(), b.N
			putLoop(b, walshipv1.NewKVServiceClient(conn), 7, "commits/s")
			close(stop)
			far.Wait()
			if syncs := s.wal.Stats().Syncs - st0.Syncs; syncs > 0 {
				b.ReportMetric(float64(n0+int(farCommits.Load()))/float64(syncs), "commits/fsync")
			}
		})
	}
}

// BenchmarkCommitWaitingReads is BenchmarkCommit's 8 sync committers
// beside reads that wait for an LSN far in the future (Get with min_lsn),
// spread over connections of their own, 250 reads each: a commit that
// woke every waiting read would pay for all of them at each advance of the
// visible LSN (issue 33: 3,000 such reads made commits 15× slower).
func BenchmarkCommitWaitingReads(b *testing.B) {
	for _, waiting := range []int{0, 3000} {
		b.Run(fmt.Sprintf("waiting=%d", waiting), func(b *testing.B) {
			s := startBench(b, walshipv1.Durability_DURABILITY_SYNC)
			ctx, cancel := context.WithCancel(context.Background())
			var readers sync.WaitGroup
			var conns []*grpc.ClientConn
			defer func() {
				cancel()
				readers.Wait()
				for _, c := range conns {
					c.Close()
				}
			}()
			before := runtime.NumGoroutine()
			for c := 0; c < waiting; c += 250 {
				conn := dialBench(b, s.Addr())
				conns = append(conns, conn)
				kv := walshipv1.NewKVServiceClient(conn)
				for range min(250, waiting-c) {
					readers.Go(func() {
						_, err := kv.Get(ctx, &walshipv1.GetRequest{Key: "far", MinLsn: 1 << 60, WaitTimeout: durationpb.New(5 * time.Minute)})
						if ctx.Err() == nil {
							b.Errorf("a read for a far LSN returned %v", err)
						}
					})
				}
			}
			// Each waiting read is a goroutine here and, past the stream
			// workers, one in the server.
			testkit.Until(b, "the reads to wait", func() bool { return runtime.NumGoroutine() >= before+2*waiting-64 })
			conn := dialBench(b, s.Addr())
			defer conn.Close()
			putLoop(b, walshipv1.NewKVServiceClient(conn), 8, "commits/s")
		})
	}
}

// putLoop runs b.N Puts through kv from committers goroutines, each
// waiting for its reply before the next (closed loop), and reports their
// rate (in unit) and the cores the process kept busy meanwhile (client and
// server: well under 2 on this machine means the run is bound by latency,
// not CPU) and the CPU time per call, in µs. It returns the rate.
func putLoop(b *testing.B, kv walshipv1.KVServiceClient, committers int, unit string) float64 {
	b.Helper()
	value := make([]byte, 100)
	var next atomic.Int64
	cpu0 := cpustat.MustSelf()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range committers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				key := fmt.Sprintf("warehouse/%d/district/%d/customer/%d", i%10, i%7, i)
				if _, err := kv.Put(context.Background(), &walshipv1.PutRequest{Key: key, Value: value}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	cpu := cpustat.MustSelf() - cpu0
	rate := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(rate, unit)
	b.ReportMetric(cpu.Seconds()/elapsed.Seconds(), "cores")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu_µs/op")
	return rate
}

// floorKV answers every Put at once: no sequencing, no WAL, no fsync.
type floorKV struct {
	walshipv1.UnimplementedKVServiceServer
}

func (floorKV) Put(context.Context, *walshipv1.PutRequest) (*walshipv1.PutResponse, error) {
	return &walshipv1.PutResponse{}, nil
}

// BenchmarkRoundTripFloor is BenchmarkCommit's loop against a KV server
// whose Put does nothing, on the same transport (internal/serve's server,
// Dialer.Options): what the gRPC round trip alone costs on loopback, in
// CPU per call and calls/s. No commit path can go faster than this on the
// same machine: a target of commits/s as a multiple of the disk's
// append+fdatasync rate is out of reach wherever that multiple is above it.
func BenchmarkRoundTripFloor(b *testing.B) {
	for _, committers := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("committers=%d", committers), func(b *testing.B) {
			srv, err := serve.New(serve.Options{Listen: "127.0.0.1:0"}, func(g *grpc.Server) {
				walshipv1.RegisterKVServiceServer(g, floorKV{})
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ctx, nil) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					b.Error(err)
				}
			}()
			srv.SetServing(true)
			conn := dialBench(b, srv.Addr())
			defer conn.Close()
			putLoop(b, walshipv1.NewKVServiceClient(conn), committers, "calls/s")
		})
	}
}

// diskAppends is how many appends diskAppendRate times: enough to average
// over the disk's jitter, few enough (~0.1-0.2 s) to sit right next to the
// commits it is compared with.
const diskAppends = 500

// diskAppendRate measures the disk under dir as internal/wal's
// BenchmarkDiskFdatasync does: 4 KiB appends to a fresh file, each followed
// by an fdatasync. It returns appends per second.
func diskAppendRate(b *testing.B, dir string) float64 {
	b.Helper()
	f, err := vfs.OS.OpenFile(filepath.Join(dir, "disk-rate"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(filepath.Join(dir, "disk-rate"))
	defer f.Close()
	buf := make([]byte, 4096)
	start := time.Now()
	for range diskAppends {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil { // vfs.OS: fdatasync
			b.Fatal(err)
		}
	}
	return diskAppends / time.Since(start).Seconds()
}
