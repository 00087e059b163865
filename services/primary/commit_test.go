package primary

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/pkg/codec"
)

// TestConcurrentCommitsUnderFailure runs many concurrent writers, each
// commit durability sync or async at random, through group commit, and
// fails the disk under them: the machine crashes, or an fsync fails (and
// then the machine crashes, or not: the unsynced pages stay readable, and
// the restart must not take them for durable). After a restart every
// acknowledged sync commit is there, and what survives is a prefix: an
// acknowledged commit is present exactly when its LSN is at most the
// recovered visible LSN.
func TestConcurrentCommitsUnderFailure(t *testing.T) {
	for _, mode := range []string{"crash", "fsync-error", "fsync-error-no-crash"} {
		t.Run(mode, func(t *testing.T) {
			mem := vfs.NewMem()
			cfg := testConfig(t, "/data")
			cfg.FS = mem
			r := start(t, cfg)
			c := ctx(t)

			type ack struct {
				key  string
				lsn  uint64
				sync bool
			}
			const writers, failAfter = 12, 400
			var (
				mu      sync.Mutex
				acked   []ack
				n       atomic.Int64
				failing sync.Once
				wg      sync.WaitGroup
			)
			fail := func() {
				if mode == "crash" {
					mem.Crash()
					return
				}
				mem.InjectSyncError(func(name string) error {
					if filepath.Ext(name) == ".wal" {
						return errors.New("injected EIO")
					}
					return nil
				})
			}
			for w := 0; w < writers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					for i := 0; ; i++ {
						key := fmt.Sprintf("w%02d/%05d", w, i)
						durable := rng.IntN(2) == 0
						d := walshipv1.Durability_DURABILITY_ASYNC
						if durable {
							d = walshipv1.Durability_DURABILITY_SYNC
						}
						p, err := r.kv.Put(c, &walshipv1.PutRequest{Key: key, Value: []byte(key),
							Policy: &walshipv1.CommitPolicy{Durability: d}})
						if err != nil {
							return // the WAL failed; later writes are refused
						}
						mu.Lock()
						acked = append(acked, ack{key, p.Lsn, durable})
						mu.Unlock()
						if n.Add(1) == failAfter {
							failing.Do(fail)
						}
					}
				}()
			}
			wg.Wait()
			if n.Load() < failAfter {
				t.Fatalf("only %d commits acknowledged before the writers stopped; want the failure injected after %d", n.Load(), failAfter)
			}
			durableAtFailure := r.s.wal.DurableLSN() // the broken log's never moves again
			r.stop(t)
			if mode != "fsync-error-no-crash" {
				mem.Crash() // whatever was written but not synced is gone
			}
			mem.InjectSyncError(nil)

			r2 := start(t, cfg)
			st, err := r2.admin.Status(c, &walshipv1.StatusRequest{})
			if err != nil {
				t.Fatal(err)
			}
			syncs := 0
			for _, a := range acked {
				g, err := r2.kv.Get(c, &walshipv1.GetRequest{Key: a.key})
				if err != nil {
					t.Fatal(err)
				}
				if a.sync {
					syncs++
					if !g.Found {
						t.Fatalf("sync commit %s (LSN %d) acknowledged but lost; recovered up to LSN %d", a.key, a.lsn, st.VisibleLsn)
					}
				}
				if want := a.lsn <= st.VisibleLsn; g.Found != want {
					t.Fatalf("commit %s at LSN %d: found=%v after recovering up to LSN %d; not a prefix", a.key, a.lsn, g.Found, st.VisibleLsn)
				}
			}
			if syncs == 0 {
				t.Fatal("no sync commit was acknowledged; the test checked nothing")
			}
			if mode == "fsync-error-no-crash" && st.VisibleLsn > durableAtFailure {
				t.Fatalf("recovered up to LSN %d from the page cache; the last LSN durable when the fsync failed was %d", st.VisibleLsn, durableAtFailure)
			}
			t.Logf("%d commits acknowledged (%d sync), recovered up to LSN %d", len(acked), syncs, st.VisibleLsn)
		})
	}
}

// TestCommitsFlowThroughRetention writes concurrently, sync and async, while
// snapshots and retention cut the WAL under the writers (the committer
// cuts between writes): every commit completes, none is left queued behind
// a cut.
func TestCommitsFlowThroughRetention(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.SegmentBytes = 64 << 10
	cfg.SnapshotEveryBytes = 128 << 10
	cfg.WALRetentionBytes = 256 << 10
	r := start(t, cfg)
	putConcurrently(t, r, 8, 300, 50, make([]byte, 1024))
	if removed := r.s.wal.Stats().SegmentsRemoved; removed == 0 {
		t.Fatal("retention removed no segment; the test did not cut the WAL under the writers")
	}
}

// TestNoCommitLeftBehind runs many writers, sync and async, hard against
// an in-memory disk (instant fsyncs): every commit is acknowledged. It is a
// stress test for lost wake-ups between the writers, the committer and the
// syncer (an experimental design without the two goroutines, writers
// taking turns at the write and the fsync, lost commits twice that way).
func TestNoCommitLeftBehind(t *testing.T) {
	cfg := testConfig(t, "/data")
	cfg.FS = vfs.NewMem()
	r := start(t, cfg)
	putConcurrently(t, r, 16, 400, 20, []byte("v"))
}

// putConcurrently runs writers goroutines, even ones durability sync and
// odd ones async, each putting value each times over keys keys of its own,
// and fails the test if any Put fails.
func putConcurrently(t *testing.T, r *running, writers, each, keys int, value []byte) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := walshipv1.Durability_DURABILITY_SYNC
			if w%2 == 1 {
				d = walshipv1.Durability_DURABILITY_ASYNC
			}
			for i := 0; i < each; i++ {
				// A deadline per Put, not for the run: a commit left
				// behind never completes, while a loaded machine only
				// makes the run slow.
				c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: fmt.Sprintf("w%02d/%d", w, i%keys), Value: value,
					Policy: &walshipv1.CommitPolicy{Durability: d}})
				cancel()
				if err != nil {
					errs <- fmt.Errorf("writer %d, put %d: %w", w, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestDurableGroupIsOneEntry holds the WAL's fsync while durable commits
// queue behind it. Once it is released, the syncer writes all of them as
// one WAL entry — one message to each replica and log store — rather than
// one entry per commit as it arrived.
func TestDurableGroupIsOneEntry(t *testing.T) {
	const queued = 8
	mem := vfs.NewMem()
	cfg := testConfig(t, "/data")
	cfg.FS = mem
	r := start(t, cfg)
	c := ctx(t)
	if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "before", Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	mem.InjectSyncError(func(name string) error {
		if filepath.Ext(name) == ".wal" {
			once.Do(func() {
				close(held)
				<-release
			})
		}
		return nil
	})
	errs := make(chan error, queued+1)
	put := func(key string) {
		_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: key, Value: []byte("v")})
		errs <- err
	}
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // a failure below must not leave the primary stuck
	nextLSN := func() uint64 { return r.s.pipe.lastSequenced() + 1 }
	go put("held")
	<-held
	entries0, lsn0 := r.s.wal.Stats().EntriesAppended, nextLSN()
	for i := range queued {
		go put(fmt.Sprintf("queued-%d", i))
	}
	// Sequenced, and so queued: a Put is a put and a commit record.
	testkit.Until(t, fmt.Sprintf("%d durable commits sequenced behind the held fsync", queued), func() bool {
		return nextLSN() == lsn0+2*queued
	})
	free()
	for range queued + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := r.s.wal.Stats().EntriesAppended - entries0; got != 1 {
		t.Errorf("%d durable commits queued during one fsync were written as %d WAL entries, want 1", queued, got)
	}
}

// TestApplyFailureStopsThePrimary: should applying sequenced records to the
// state ever fail (a bug: the sequencer built them), visibility stops and
// so does the primary — Run returns the error — while writers keep
// sequencing. Making it fail here: a record the sequencer never built is
// applied behind its back, so the next resolved prefix no longer follows
// the store's applied LSN.
func TestApplyFailureStopsThePrimary(t *testing.T) {
	cfg := testConfig(t, "/data")
	cfg.FS = vfs.NewMem()
	r := start(t, cfg)
	c := ctx(t)
	var puts atomic.Int64
	var writers sync.WaitGroup
	for w := range 4 {
		writers.Go(func() {
			for i := 0; ; i++ {
				_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: fmt.Sprintf("w%d/%d", w, i%20), Value: []byte("v")})
				if err != nil {
					return // UNAVAILABLE once the primary fails, or its connection gone
				}
				puts.Add(1)
			}
		})
	}
	testkit.Until(t, "writers committing", func() bool { return puts.Load() >= 100 })
	r.s.pipe.visMu.Lock()
	applied := r.s.store.AppliedLSN()
	err := r.s.store.Apply(&codec.Batch{Records: []codec.Record{{LSN: applied + 1, TxnID: 1 << 60, Op: codec.OpCommit}}})
	r.s.pipe.visMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.failed(t, "applying sequenced records failed (or the writers and resolve deadlocked)"); err == nil || !strings.Contains(err.Error(), "apply sequenced records") {
		t.Fatalf("Run returned %v; want the apply error", err)
	}
	writers.Wait()
}

// TestGatherTargetIsTheTypicalCycle: the syncer gathers as many durable
// commits as a typical recent cycle had writers (the median, rounding
// down), not the peak, and nothing after an idle spell.
func TestGatherTargetIsTheTypicalCycle(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cycles []int
		want   int
	}{
		{"no history", nil, 0},
		{"eight closed-loop writers", []int{8, 8, 8, 8, 8}, 8},
		{"seven, and one far away now and then", []int{7, 7, 8, 7, 7}, 7},
		{"two cycles, rounding down", []int{7, 8}, 7},
		{"writers left two cycles ago", []int{8, 8, 8, 1, 1}, 8},
		{"writers left three cycles ago", []int{8, 8, 8, 1, 1, 1}, 1},
		{"more writers joined", []int{4, 4, 4, 16, 16, 16}, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var g groupSizer
			for _, n := range tc.cycles {
				g.noteCycle(n)
			}
			if got := g.gatherTarget(0); got != tc.want {
				t.Fatalf("cycles %v: gatherTarget = %d, want %d", tc.cycles, got, tc.want)
			}
			g.at = time.Now().Add(-2 * cycleMemory)
			if got := g.gatherTarget(0); got != 0 {
				t.Fatalf("cycles %v, then idle for %v: gatherTarget = %d, want 0", tc.cycles, 2*cycleMemory, got)
			}
		})
	}
}
