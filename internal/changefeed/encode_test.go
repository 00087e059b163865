package changefeed

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// records turns fuzz input into transactions of puts and deletes over a
// few keys under a/ and b/ (so that prefixes match all, some or none of
// a transaction's writes), each byte one write; 0xff ends a transaction.
func records(data []byte) []codec.Record {
	var recs []codec.Record
	lsn, start := uint64(0), 0
	commit := func() {
		lsn++
		for i := start; i < len(recs); i++ {
			recs[i].TxnID = lsn
		}
		recs = append(recs, codec.Record{LSN: lsn, TxnID: lsn, Op: codec.OpCommit})
		start = len(recs)
	}
	for _, c := range data {
		if c == 0xff {
			commit()
			continue
		}
		lsn++
		r := codec.Record{LSN: lsn, Op: codec.OpPut, Key: fmt.Appendf(nil, "%c/%d", "ab"[c&1], c>>1&3), Value: bytes.Repeat([]byte{c}, int(c>>3))}
		if c&0x80 != 0 {
			r.Op, r.Value = codec.OpDelete, nil
		}
		recs = append(recs, r)
	}
	commit()
	return recs
}

// want is the message a watcher with f gets for txns, built event by
// event as a watcher did before messages were assembled from shared
// encodings.
func want(f filter, txns []*Txn) *walshipv1.WatchResponse {
	out := &walshipv1.WatchTxns{}
	for _, t := range txns {
		var evs []*Event
		for _, e := range t.Events() {
			if !f.match(e.Key) {
				continue
			}
			if !f.prev {
				e = &Event{Type: e.Type, Key: e.Key, Value: e.Value}
			}
			evs = append(evs, e)
		}
		if len(evs) > 0 {
			out.Txns = append(out.Txns, &walshipv1.WatchTxn{Lsn: t.LSN, FirstLsn: t.FirstLSN, CommitTimeUnixNano: t.CommitTime, Events: evs})
		}
	}
	return &walshipv1.WatchResponse{Msg: &walshipv1.WatchResponse_Txns{Txns: out}}
}

// checkAssembled checks that the message assembled from shared encodings
// is, byte for byte, the marshalled message built event by event, for
// every kind of filter, twice (the second time from the kept encodings).
func checkAssembled(t *testing.T, data []byte) {
	st := state.New()
	var b codec.Batch
	// The state before: some keys exist, for previous values.
	for i, k := range []string{"a/0", "a/2", "b/1"} {
		b.Records = append(b.Records, codec.Record{LSN: uint64(i + 1), TxnID: 4, Op: codec.OpPut, Key: []byte(k), Value: []byte("old")})
	}
	b.Records = append(b.Records, codec.Record{LSN: 4, TxnID: 4, Op: codec.OpCommit})
	if err := st.Apply(&b); err != nil {
		t.Fatal(err)
	}
	recs := records(data)
	for i := range recs {
		recs[i].LSN += 4
		recs[i].TxnID += 4
	}
	changes, err := st.ApplyChanges(&codec.Batch{Records: recs}, nil)
	if err != nil {
		t.Fatal(err)
	}
	txns := FromChanges(nil, recs, changes, func(lsn uint64) int64 { return int64(lsn) * 7 })
	for range 2 {
		for _, f := range []filter{{}, {prefix: "a/"}, {prefix: "b/1"}, {prefix: "c/"}, {key: "a/1", exact: true}, {key: "a", exact: true}} {
			for _, prev := range []bool{false, true} {
				f.prev = prev
				m := message{pool: &bufferPool{}}
				for _, x := range txns {
					elem, err := f.elem(x)
					if err != nil {
						t.Fatal(err)
					}
					if elem != nil {
						m.add(elem, x)
					}
				}
				got, err := proto.Marshal(&m)
				if err != nil {
					t.Fatal(err)
				}
				eb := m.EncodedBuffers()
				own := eb.Materialize()
				eb.Free()
				if !bytes.Equal(own, got) {
					t.Fatalf("filter %+v: EncodedBuffers\n%x\nmarshalled\n%x", f, own, got)
				}
				if shared := m.shared().Materialize(); !bytes.Equal(shared, got) {
					t.Fatalf("filter %+v: shared\n%x\nmarshalled\n%x", f, shared, got)
				}
				w, err := proto.Marshal(want(f, txns))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, w) {
					t.Fatalf("filter %+v: assembled\n%x\nwant\n%x", f, got, w)
				}
				m.release()
			}
		}
	}
}

func TestAssembledMessage(t *testing.T) {
	for _, data := range [][]byte{
		nil,                            // an empty transaction
		{0x00, 0xff, 0x01, 0x02, 0xff}, // whole matches
		{0x00, 0x01, 0x02, 0x03, 0x80, 0x81, 0x40, 0x7e}, // partial matches, deletes, previous values from earlier writes
		bytes.Repeat([]byte{0xf8}, 300),                  // large values: multi-byte lengths
	} {
		checkAssembled(t, data)
	}
}

func FuzzAssembledMessage(f *testing.F) {
	f.Add([]byte{0x00, 0x01, 0x02, 0x03, 0xff, 0x80, 0x81, 0x40, 0x7e})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return
		}
		checkAssembled(t, data)
	})
}

// sharedCodec is the server codec of internal/serve as far as messages go:
// a message that carries its encoding is sent as it is.
type sharedCodec struct{}

func (sharedCodec) Name() string { return "proto" }

func (sharedCodec) Marshal(v any) (mem.BufferSlice, error) {
	if p, ok := v.(interface{ EncodedBuffers() mem.BufferSlice }); ok {
		return p.EncodedBuffers(), nil
	}
	return encoding.GetCodecV2("proto").Marshal(v)
}

func (sharedCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2("proto").Unmarshal(data, v)
}

// Through a server codec that sends shared encodings as they are, many
// watchers of one prefix, with and without previous values, get every
// transaction whole or filtered, in order, from the ring and from the WAL.
func TestWatchSharedEncodings(t *testing.T) {
	n := newNodeWith(t, 0, 0, grpc.ForceServerCodecV2(sharedCodec{}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l1 := n.commit(t, "a/1", "x", "b/1", "y")
	l2 := n.commit(t, "a/1", "x2", "a/2", "z")
	n.feed.Bound.Advance(l2)
	type watch struct {
		req  *walshipv1.WatchRequest
		want []string
	}
	var watches []watch
	for range 20 {
		watches = append(watches,
			watch{&walshipv1.WatchRequest{Prefix: "a/", StartLsn: 1, PrevValues: true}, []string{"a/1=x", fmt.Sprintf("a/1=x2(was x@%d) a/2=z", l1)}},
			watch{&walshipv1.WatchRequest{Prefix: "a/", StartLsn: 1}, []string{"a/1=x", "a/1=x2 a/2=z"}},
			watch{&walshipv1.WatchRequest{StartLsn: 1}, []string{"a/1=x b/1=y", "a/1=x2 a/2=z"}},
			watch{&walshipv1.WatchRequest{Key: "a/2", StartLsn: 1}, []string{"a/2=z"}})
	}
	streams := make([]walshipv1.KVService_WatchClient, len(watches))
	for i, w := range watches {
		s, err := n.kv.Watch(ctx, w.req)
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = s
	}
	for i, w := range watches {
		for _, want := range w.want {
			if got := events(recvTxn(t, streams[i])); got != want {
				t.Fatalf("watch %d (%v): %s, want %s", i, w.req, got, want)
			}
		}
	}
}

// A run of the ring larger than maxMessageBytes is sent as several
// messages, built once and shared: every watcher of the selection gets
// the same split, whole transactions in LSN order, none lost or repeated.
func TestWatchSharedRunSplit(t *testing.T) {
	n := newNodeWith(t, 0, 0, grpc.ForceServerCodecV2(sharedCodec{}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var lsns []uint64
	big := strings.Repeat("v", 300<<10)
	for i := range 5 { // 1.5 MiB: a message takes 3 of them, the next 2
		lsns = append(lsns, n.commit(t, fmt.Sprintf("a/%d", i), big))
	}
	var streams []walshipv1.KVService_WatchClient
	for range 4 {
		s, err := n.kv.Watch(ctx, &walshipv1.WatchRequest{Prefix: "a/", StartLsn: 1}, grpc.MaxCallRecvMsgSize(4<<20))
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	n.feed.Bound.Advance(n.lsn)
	for i, s := range streams {
		var got []uint64
		var split []int
		for len(got) < len(lsns) {
			m, err := s.Recv()
			if err != nil {
				t.Fatalf("watcher %d: %v", i, err)
			}
			txns := m.GetTxns().GetTxns()
			if len(txns) == 0 {
				continue // progress
			}
			split = append(split, len(txns))
			for _, x := range txns {
				if len(x.GetEvents()) != 1 || len(x.GetEvents()[0].GetValue()) != len(big) {
					t.Fatalf("watcher %d: transaction %d not whole: %d events", i, x.GetLsn(), len(x.GetEvents()))
				}
				got = append(got, x.GetLsn())
			}
		}
		if !slices.Equal(got, lsns) || !slices.Equal(split, []int{3, 2}) {
			t.Fatalf("watcher %d: transactions %v in messages of %v; want %v in messages of [3 2]", i, got, split, lsns)
		}
	}
}
