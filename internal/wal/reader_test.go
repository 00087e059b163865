package wal

import (
	"context"
	"errors"
	"testing"

	"github.com/walship/walship/internal/vfs"
)

type nextResult struct {
	e   Entry
	err error
}

// goNext calls r.Next in a goroutine; the result arrives on the channel.
func goNext(ctx context.Context, r *Reader) <-chan nextResult {
	ch := make(chan nextResult, 1)
	go func() {
		e, err := r.Next(ctx)
		ch <- nextResult{e, err}
	}()
	return ch
}

func TestReaderPositions(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, 2048)
	defer l.Close()
	// 3-LSN entries of varying size over many segments, enough that the
	// sparse index has several points per segment.
	var want []Entry
	for lsn := uint64(1); lsn <= 3000; lsn += 3 { // entries 1..3, ..., 2998..3000
		want = append(want, mkEntry(lsn, lsn+2, int(lsn%200)))
	}
	mustNoErr(t, l.Append(want...))
	for _, from := range []uint64{1, 2, 3, 4, 500, 1001, 1500, 2998, 2999} {
		r, err := l.NewReader(from, false)
		mustNoErr(t, err)
		e, err := r.Next(context.Background())
		mustNoErr(t, err)
		idx := (from - 1) / 3
		if !sameEntry(e, want[idx]) {
			t.Fatalf("from %d: got %d..%d, want the entry containing it %d..%d", from, e.FirstLSN, e.LastLSN, want[idx].FirstLSN, want[idx].LastLSN)
		}
		if idx+1 < uint64(len(want)) {
			e, err = r.Next(context.Background())
			mustNoErr(t, err)
			if !sameEntry(e, want[idx+1]) {
				t.Fatalf("from %d: second entry %d..%d", from, e.FirstLSN, e.LastLSN)
			}
		}
		mustNoErr(t, r.Close())
	}
	r, err := l.NewReader(3001, false) // LastLSN+1: waits for the next entry
	mustNoErr(t, err)
	mustNoErr(t, r.Close())
	_, err = l.NewReader(3002, false)
	wantErr(t, err, ErrFuture)
	_, err = l.NewReader(0, false)
	wantErr(t, err, ErrCompacted)
}

func TestReaderWokenByAppend(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, 0)
	defer l.Close()
	mustNoErr(t, l.Append(mkEntry(1, 1, 10)))
	r, err := l.NewReader(2, false)
	mustNoErr(t, err)
	defer r.Close()
	ch := goNext(context.Background(), r)
	e := mkEntry(2, 4, 10)
	mustNoErr(t, l.Append(e))
	res := <-ch
	mustNoErr(t, res.err)
	if !sameEntry(res.e, e) {
		t.Fatalf("got %d..%d", res.e.FirstLSN, res.e.LastLSN)
	}
}

func TestReaderOnEmptyLog(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, 0)
	defer l.Close()
	r, err := l.NewReader(50, false)
	mustNoErr(t, err)
	ch := goNext(context.Background(), r)
	e := mkEntry(50, 50, 3)
	mustNoErr(t, l.Append(e))
	res := <-ch
	mustNoErr(t, res.err)
	if !sameEntry(res.e, e) {
		t.Fatalf("got %d..%d", res.e.FirstLSN, res.e.LastLSN)
	}
	mustNoErr(t, r.Close())

	// A reader for an LSN the log started after can never be served.
	l2 := openMem(t, vfs.NewMem(), 0)
	defer l2.Close()
	r, err = l2.NewReader(10, false)
	mustNoErr(t, err)
	defer r.Close()
	ch = goNext(context.Background(), r)
	mustNoErr(t, l2.Append(mkEntry(20, 20, 1)))
	wantErr(t, (<-ch).err, ErrCompacted)
}

func TestDurableReaderWokenBySync(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, 0)
	defer l.Close()
	r, err := l.NewReader(1, true)
	mustNoErr(t, err)
	defer r.Close()
	e := mkEntry(1, 1, 10)
	mustNoErr(t, l.Append(e))

	// Appended but not synced: a durable reader has nothing to return.
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = r.Next(canceled)
	wantErr(t, err, context.Canceled)

	ch := goNext(context.Background(), r)
	select {
	case res := <-ch:
		t.Fatalf("durable reader returned an unsynced entry: %+v", res)
	default:
	}
	mustNoErr(t, l.Sync())
	res := <-ch
	mustNoErr(t, res.err)
	if !sameEntry(res.e, e) {
		t.Fatalf("got %d..%d", res.e.FirstLSN, res.e.LastLSN)
	}
	// An available entry is returned even with a done context.
	mustNoErr(t, l.Append(mkEntry(2, 2, 1)))
	mustNoErr(t, l.Sync())
	if _, err := r.Next(canceled); err != nil {
		t.Fatalf("Next with a done ctx and an entry ready: %v", err)
	}
}

func TestReaderCancelAndClose(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, 0)
	mustNoErr(t, l.Append(mkEntry(1, 1, 1)))

	r, err := l.NewReader(2, false)
	mustNoErr(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ch := goNext(ctx, r)
	cancel()
	wantErr(t, (<-ch).err, context.Canceled)

	ch = goNext(context.Background(), r)
	mustNoErr(t, r.Close())
	wantErr(t, (<-ch).err, ErrClosed)
	mustNoErr(t, r.Close())
	_, err = r.Next(context.Background())
	wantErr(t, err, ErrClosed)

	r2, err := l.NewReader(2, false)
	mustNoErr(t, err)
	defer r2.Close()
	ch = goNext(context.Background(), r2)
	mustNoErr(t, l.Close())
	wantErr(t, (<-ch).err, ErrClosed)
	_, err = l.NewReader(1, false)
	wantErr(t, err, ErrClosed)
}

func TestReaderCompactedUnderIt(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, mxSegSize)
	defer l.Close()
	mustNoErr(t, l.Append(seqEntries(1, 12, mxData)...))
	r, err := l.NewReader(1, false)
	mustNoErr(t, err)
	defer r.Close()
	_, err = r.Next(context.Background())
	mustNoErr(t, err)
	n, err := l.TruncateBefore(9)
	mustNoErr(t, err)
	if n != 2 {
		t.Fatalf("removed %d", n)
	}
	_, err = r.Next(context.Background())
	wantErr(t, err, ErrCompacted)
}

func TestWait(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, 0)
	defer l.Close()
	done := make(chan error, 2)
	go func() { done <- l.Wait(context.Background(), 3, false) }()
	go func() { done <- l.Wait(context.Background(), 3, true) }()
	mustNoErr(t, l.Append(seqEntries(1, 3, 1)...))
	mustNoErr(t, <-done)
	mustNoErr(t, l.Sync())
	mustNoErr(t, <-done)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Wait(ctx, 10, false); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v", err)
	}
}
