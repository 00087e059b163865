package wal

import (
	"fmt"
	"os"
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

// BenchmarkAppendSync is one Append of one entry and one Sync per op through
// the WAL on the real filesystem.
func BenchmarkAppendSync(b *testing.B) {
	for _, size := range []int{4096} {
		b.Run(fmt.Sprintf("entry=%d", size), func(b *testing.B) {
			l, err := Open(Options{Dir: benchDir(b)})
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
