package kvread

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/watermark"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func reader(t *testing.T, keys int) (*Reader, *state.Store, *watermark.Watermark) {
	st := state.New()
	var b codec.Batch
	lsn := uint64(1)
	for i := 0; i < keys; i++ {
		b.Records = append(b.Records, codec.Record{LSN: lsn, TxnID: 1, Op: codec.OpPut, Key: []byte(fmt.Sprintf("k%03d", i)), Value: []byte("v")})
		lsn++
	}
	b.Records = append(b.Records, codec.Record{LSN: lsn, TxnID: 1, Op: codec.OpCommit})
	if err := st.Apply(&b); err != nil {
		t.Fatal(err)
	}
	var w watermark.Watermark
	w.Advance(st.AppliedLSN())
	return &Reader{View: st.Snapshot, Visible: &w}, st, &w
}

func TestScanLimitsAndWaits(t *testing.T) {
	r, _, w := reader(t, 30)
	ctx := context.Background()
	resp, err := r.Scan(ctx, &walshipv1.ScanRequest{Start: "k010", End: "k020", Limit: 4})
	if err != nil || len(resp.Kvs) != 4 || !resp.More || resp.Kvs[0].Key != "k010" {
		t.Fatalf("Scan limit 4 = %v, %v", resp, err)
	}
	resp, err = r.Scan(ctx, &walshipv1.ScanRequest{Start: "k010", End: "k020"})
	if err != nil || len(resp.Kvs) != 10 || resp.More {
		t.Fatalf("Scan [k010,k020) = %d pairs more=%v, %v", len(resp.Kvs), resp.More, err)
	}
	// A min_lsn beyond the visible LSN waits, then fails with DEADLINE_EXCEEDED naming the LSNs.
	_, err = r.Get(ctx, &walshipv1.GetRequest{Key: "k001", MinLsn: w.Load() + 5, WaitTimeout: durationpb.New(30 * time.Millisecond)})
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), fmt.Sprint(w.Load()+5)) {
		t.Fatalf("Get past the visible LSN: %v", err)
	}
	// It is served as soon as the LSN becomes visible.
	next := w.Load() + 1
	done := make(chan error, 1)
	go func() {
		_, err := r.Get(ctx, &walshipv1.GetRequest{Key: "k001", MinLsn: next, WaitTimeout: durationpb.New(time.Minute)})
		done <- err
	}()
	w.Advance(next)
	if err := <-done; err != nil {
		t.Fatalf("Get woken by the advance: %v", err)
	}
	for _, tc := range []struct {
		req  *walshipv1.ScanRequest
		want string
	}{
		{&walshipv1.ScanRequest{Limit: MaxScanLimit + 1}, "limit"},
		{&walshipv1.ScanRequest{Start: "b", End: "a"}, "end"},
		{&walshipv1.ScanRequest{MinLsn: 1, WaitTimeout: durationpb.New(time.Hour)}, "wait_timeout"},
		{&walshipv1.ScanRequest{MinLsn: 1, WaitTimeout: &durationpb.Duration{Seconds: 1, Nanos: -5}}, "wait_timeout"},
	} {
		if _, err := r.Scan(ctx, tc.req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Scan(%v) = %v; want InvalidArgument naming %s", tc.req, err, tc.want)
		}
	}
}

// TestWaitingReadsAreBounded: at most 256 reads of one connection and
// 4,096 of the server wait for their min_lsn at once; one more fails at
// once with RESOURCE_EXHAUSTED instead of holding a goroutine and a stream
// for up to MaxWait. Answered reads free their places.
func TestWaitingReadsAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, _, w := reader(t, 1)
		far := w.Load() + 1
		conn := func(i int) context.Context {
			return peer.NewContext(t.Context(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 10000 + i}})
		}
		get := func(ctx context.Context) error {
			_, err := r.Get(ctx, &walshipv1.GetRequest{Key: "k000", MinLsn: far, WaitTimeout: durationpb.New(MaxWait)})
			return err
		}
		var wg sync.WaitGroup
		var served atomic.Int64
		wait := func(ctx context.Context) {
			wg.Go(func() {
				if err := get(ctx); err != nil {
					t.Errorf("a read within the limits: %v", err)
				}
				served.Add(1)
			})
		}
		// try runs one read that should be refused, and reports what it
		// returned once every other read is asleep (nil: still waiting).
		try := func(ctx context.Context) (err error, returned bool) {
			done := make(chan error, 1)
			wg.Go(func() { done <- get(ctx) })
			synctest.Wait()
			select {
			case err := <-done:
				return err, true
			default:
				return nil, false
			}
		}
		for range 256 {
			wait(conn(0))
		}
		synctest.Wait()
		if err, ok := try(conn(0)); !ok || status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "this connection") {
			t.Errorf("read 257 of one connection: returned %v, %v; want RESOURCE_EXHAUSTED naming the connection", ok, err)
		}
		for c := 1; c < 16; c++ {
			for range 256 {
				wait(conn(c))
			}
		}
		synctest.Wait()
		if err, ok := try(conn(99)); !ok || status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "this server") {
			t.Errorf("read 4,097 of the server: returned %v, %v; want RESOURCE_EXHAUSTED naming the server", ok, err)
		}
		w.Advance(far)
		wg.Wait()
		if n := served.Load(); n != 4096 {
			t.Errorf("%d reads served; want 4096", n)
		}
		far++
		// Their places are free again.
		for range 256 {
			wait(conn(0))
		}
		synctest.Wait()
		if err, ok := try(conn(0)); !ok || status.Code(err) != codes.ResourceExhausted {
			t.Errorf("read 257 of one connection after the first 256 were answered: returned %v, %v", ok, err)
		}
		w.Advance(far + 1)
		wg.Wait()
	})
}

// TestScanPagesAtOneMiB: a Scan stops before its keys and values pass
// 1 MiB (more=true), except that one pair larger than that is returned
// alone; each response is marshalled and held until the peer takes it, so
// its size times the calls in progress is what a server holds for Scans.
func TestScanPagesAtOneMiB(t *testing.T) {
	st := state.New()
	var b codec.Batch
	for i, n := range []int{500 << 10, 500 << 10, 500 << 10, 3 << 20, 10} {
		b.Records = append(b.Records, codec.Record{LSN: uint64(i + 1), TxnID: 1, Op: codec.OpPut, Key: []byte(fmt.Sprintf("v%d", i)), Value: make([]byte, n)})
	}
	b.Records = append(b.Records, codec.Record{LSN: 6, TxnID: 1, Op: codec.OpCommit})
	if err := st.Apply(&b); err != nil {
		t.Fatal(err)
	}
	var w watermark.Watermark
	w.Advance(st.AppliedLSN())
	r := &Reader{View: st.Snapshot, Visible: &w}
	var pages [][]string
	for start := ""; ; {
		resp, err := r.Scan(context.Background(), &walshipv1.ScanRequest{Start: start})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, kv := range resp.Kvs {
			keys = append(keys, kv.Key)
		}
		pages = append(pages, keys)
		if !resp.More {
			break
		}
		start = keys[len(keys)-1] + "\x00"
	}
	if got, want := fmt.Sprint(pages), "[[v0 v1] [v2] [v3] [v4]]"; got != want {
		t.Fatalf("pages %s; want %s", got, want)
	}
}
