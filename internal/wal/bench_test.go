package wal

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/walship/walship/internal/vfs"
)

// benchDir returns a fresh directory on the disk under test:
// $WALSHIP_BENCH_DIR if set, else the default temp dir. fdatasync numbers
// are only meaningful on a real disk, not on tmpfs; check with df.
func benchDir(b *testing.B) string {
	b.Helper()
	parent := os.Getenv("WALSHIP_BENCH_DIR")
	if parent == "" {
		return b.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "walbench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func reportOps(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkDiskFdatasync measures the disk itself: one 4 KiB append and one
// fdatasync per op on a plain file, without the WAL. It is the ceiling for
// BenchmarkAppendSync.
func BenchmarkDiskFdatasync(b *testing.B) {
	for _, size := range []int{4096} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			f, err := vfs.OS.OpenFile(benchDir(b)+"/data", os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			buf := make([]byte, size)
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, err := f.Write(buf); err != nil {
					b.Fatal(err)
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
			}
			reportOps(b)
		})
	}
}

// BenchmarkDiskFdatasyncOverwrite is BenchmarkDiskFdatasync on blocks that
// are already written and synced: 4 KiB overwrites of a zero-filled file,
// one fdatasync each, with no size or extent change for the sync to carry.
// It is the disk's best case, what preallocation aims for.
func BenchmarkDiskFdatasyncOverwrite(b *testing.B) {
	const size, fileSize = 4096, 64 << 20
	f, err := vfs.OS.OpenFile(benchDir(b)+"/data", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < fileSize; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros, off); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i)
	}
	b.SetBytes(size)
	off := int64(0)
	for b.Loop() {
		if _, err := f.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		off = (off + size) % fileSize
	}
	reportOps(b)
}

// BenchmarkAppendSync is one Append of one entry and one Sync per op through
// the WAL on the real filesystem, with the active segment preallocated
// (zero-filled ahead of the writes, the default) or not (every write extends
// the file).
func BenchmarkAppendSync(b *testing.B) {
	for _, prealloc := range []struct {
		name string
		size int64
	}{{"on", 0}, {"off", -1}} {
		for _, size := range []int{4096} {
			b.Run(fmt.Sprintf("prealloc=%s/entry=%d", prealloc.name, size), func(b *testing.B) {
				l, err := Open(Options{Dir: benchDir(b), Preallocate: prealloc.size})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				data := make([]byte, size)
				b.SetBytes(int64(size))
				lsn := uint64(1)
				for b.Loop() {
					if err := l.Append(Entry{FirstLSN: lsn, LastLSN: lsn, Data: data}); err != nil {
						b.Fatal(err)
					}
					if err := l.Sync(); err != nil {
						b.Fatal(err)
					}
					lsn++
				}
				reportOps(b)
			})
		}
	}
}

// BenchmarkAppend is Append without Sync (page cache speed), one entry or a
// batch of 16 per op.
func BenchmarkAppend(b *testing.B) {
	for _, size := range []int{128, 4096} {
		for _, batch := range []int{1, 16} {
			b.Run(fmt.Sprintf("entry=%d/batch=%d", size, batch), func(b *testing.B) {
				l, err := Open(Options{Dir: benchDir(b)})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				data := make([]byte, size)
				es := make([]Entry, batch)
				b.SetBytes(int64(size * batch))
				lsn := uint64(1)
				for b.Loop() {
					for i := range es {
						es[i] = Entry{FirstLSN: lsn, LastLSN: lsn, Data: data}
						lsn++
					}
					if err := l.Append(es...); err != nil {
						b.Fatal(err)
					}
				}
				reportOps(b)
			})
		}
	}
}

// BenchmarkDiskFdatasyncParallel runs the same 4 KiB append+fdatasync loop
// on 1, 2 and 4 files at once, one goroutine each, and reports the total
// rate: whether the disk serves concurrent fsyncs of different files (a
// primary, its replicas and a log store on one machine) in parallel.
func BenchmarkDiskFdatasyncParallel(b *testing.B) {
	for _, files := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("files=%d", files), func(b *testing.B) {
			dir := benchDir(b)
			fs := make([]vfs.File, files)
			for i := range fs {
				f, err := vfs.OS.OpenFile(fmt.Sprintf("%s/data%d", dir, i), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				fs[i] = f
			}
			buf := make([]byte, 4096)
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, files)
			b.ResetTimer()
			for _, f := range fs {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						if _, err := f.Write(buf); err != nil {
							errs <- err
							return
						}
						if err := f.Sync(); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			reportOps(b)
		})
	}
}
