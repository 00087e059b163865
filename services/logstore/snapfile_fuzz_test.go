package logstore

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/basesnap"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/protobuf/proto"
)

// snapPair is one key/value pair of a base snapshot, with its version.
type snapPair struct {
	key, value []byte
	version    uint64
}

// baseSeed is a base snapshot file written by the log store's own writer,
// with what was written into it.
type baseSeed struct {
	data    []byte
	meta    *walshipv1.SnapshotHeader
	pairs   []snapPair
	digest  state.Digest
	written *baseSnap // what writeSnapshot returned for the file
}

// putFeed is the receiving side of a PutSnapshot stream that replays msgs,
// then ends; writeSnapshot only calls Recv.
type putFeed struct {
	walshipv1.LogStoreService_PutSnapshotServer
	msgs []*walshipv1.PutSnapshotRequest
}

func (p *putFeed) Recv() (*walshipv1.PutSnapshotRequest, error) {
	if len(p.msgs) == 0 {
		return nil, io.EOF
	}
	m := p.msgs[0]
	p.msgs = p.msgs[1:]
	return m, nil
}

// viewAfter applies bs, in order, to a new store and returns its state.
func viewAfter(tb testing.TB, bs []*walshipv1.WalBatch) *state.View {
	tb.Helper()
	st := state.New()
	for _, b := range bs {
		var cb codec.Batch
		if err := envelope.Decode(b, &cb); err != nil {
			tb.Fatal(err)
		}
		if err := st.Apply(&cb); err != nil {
			tb.Fatal(err)
		}
	}
	return st.Snapshot()
}

// writeBaseSeed stores the state v as a base snapshot at lsn with meta's
// epoch and history through the log store's writer (writeSnapshot, fed
// the chunks and trailer of an upload), and returns the file's bytes.
func writeBaseSeed(tb testing.TB, v *state.View, lsn, epoch uint64, history []*walshipv1.EpochStart) baseSeed {
	tb.Helper()
	dir := tb.TempDir()
	s := &Server{cfg: Config{DataDir: dir}, fs: vfs.OS}
	if err := os.MkdirAll(s.snapDir(), 0o755); err != nil {
		tb.Fatal(err)
	}
	meta := &walshipv1.SnapshotHeader{Epoch: epoch, Lsn: lsn, Keys: uint64(v.Len()), ClusterId: clusterA,
		CommitTimeUnixNano: baseTime.UnixNano(), History: history}
	// The upload's own header is what putSnapshot reads before the writer
	// starts; the writer gets the chunks and the trailer.
	written, err := s.writeSnapshot(&putFeed{msgs: upload(v, epoch, history...)[1:]}, proto.Clone(meta).(*walshipv1.SnapshotHeader))
	if err != nil {
		tb.Fatalf("writeSnapshot at LSN %d: %v", lsn, err)
	}
	data, err := os.ReadFile(filepath.Join(s.snapDir(), baseName(lsn)))
	if err != nil {
		tb.Fatal(err)
	}
	seed := baseSeed{data: data, meta: meta, digest: v.Digest(), written: written}
	v.Scan(nil, nil, 0, func(k, val []byte, ver uint64) bool {
		seed.pairs = append(seed.pairs, snapPair{bytes.Clone(k), bytes.Clone(val), ver})
		return true
	})
	if uint64(len(seed.pairs)) != meta.Keys {
		tb.Fatalf("the view scanned %d pairs, its length is %d", len(seed.pairs), meta.Keys)
	}
	return seed
}

// damageBase applies one damage to data, chosen by op: none, xor the byte
// at pos with val, overwrite it with val, truncate at pos, or append
// pos%257 bytes of val. It returns a new slice.
func damageBase(data []byte, op uint8, pos uint32, val uint8) []byte {
	out := bytes.Clone(data)
	switch op % 5 {
	case 1:
		if len(out) > 0 {
			out[int(pos)%len(out)] ^= val
		}
	case 2:
		if len(out) > 0 {
			out[int(pos)%len(out)] = val
		}
	case 3:
		out = out[:int(pos)%(len(out)+1)]
	case 4:
		out = append(out, bytes.Repeat([]byte{val}, int(pos%257))...)
	}
	return out
}

// FuzzOpenBase: a base snapshot file, as the writer made it or damaged
// (a byte xored or overwritten, truncated, extended, under another LSN's
// name, or arbitrary bytes), is either refused by openBase or scanBase
// with an error wrapping basesnap.ErrBad (scanBase's naming the file), or
// read back self-consistent: the LSN of its name, of its meta and of its
// state agree, the pairs are as many as the meta says and re-encode, with
// the digest its trailer states, to exactly the state part of the file.
// The writer's files, untouched, read back exactly as written: meta
// (LSN, epoch, history), pairs and digest. Nothing panics.
func FuzzOpenBase(f *testing.F) {
	few := chain(f, 1, 1, 3, 5)
	var epochs []*walshipv1.WalBatch
	epochs = append(epochs, chain(f, 1, 1, 4, 8)...)   // LSNs 1..8
	epochs = append(epochs, chain(f, 2, 9, 5, 16)...)  // LSNs 9..18
	epochs = append(epochs, chain(f, 3, 19, 3, 0)...)  // LSNs 19..24, empty values
	epochs = append(epochs, chain(f, 5, 25, 6, 40)...) // LSNs 25..36
	seeds := []baseSeed{
		// An empty state at LSN 3 (every key deleted, say).
		writeBaseSeed(f, state.New().Snapshot(), 3, 1, []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}}),
		writeBaseSeed(f, viewAfter(f, few), 6, 1, []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}}),
		writeBaseSeed(f, viewAfter(f, epochs), 36, 5, []*walshipv1.EpochStart{
			{Epoch: 1, FirstLsn: 1}, {Epoch: 2, FirstLsn: 9}, {Epoch: 3, FirstLsn: 19}, {Epoch: 5, FirstLsn: 25}}),
	}
	const (
		none uint8 = iota
		xor
		overwrite
		truncate
		extend
	)
	for _, s := range seeds {
		lsn := s.meta.Lsn
		off := uint32(s.written.stateOff)
		end := uint32(len(s.data))
		f.Add(s.data, lsn, none, uint32(0), uint8(0))
		f.Add(s.data, lsn+1, none, uint32(0), uint8(0))                     // under another LSN's name
		f.Add(s.data, lsn, xor, uint32(basesnap.PrefixSize+1), uint8(0x10)) // the meta
		f.Add(s.data, lsn, xor, uint32(12), uint8(0x80))                    // the meta length
		f.Add(s.data, lsn, xor, off+16, uint8(1))                           // the state header's LSN
		f.Add(s.data, lsn, xor, off+24, uint8(1))                           // the state header's count
		f.Add(s.data, lsn, xor, end-basesnap.StateTrailerSize, uint8(1))    // the digest
		f.Add(s.data, lsn, xor, end-1, uint8(1))                            // the state CRC
		f.Add(s.data, lsn, overwrite, off+(end-off)/2, uint8(0xff))         // a pair, if any
		f.Add(s.data, lsn, truncate, end-1, uint8(0))
		f.Add(s.data, lsn, truncate, off+basesnap.StateHeaderSize+basesnap.StateTrailerSize, uint8(0))
		f.Add(s.data, lsn, extend, uint32(1), uint8(0))
	}
	f.Add([]byte{}, uint64(1), none, uint32(0), uint8(0))
	f.Add([]byte(basesnap.Magic), uint64(1), none, uint32(0), uint8(0))

	f.Fuzz(func(t *testing.T, data []byte, nameLSN uint64, op uint8, pos uint32, val uint8) {
		file := damageBase(data, op, pos, val)
		name := baseName(nameLSN)
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, name), file, 0o644); err != nil {
			t.Fatal(err)
		}
		// want is the writer's file these bytes are, under its own name.
		var want *baseSeed
		for i := range seeds {
			if nameLSN == seeds[i].meta.Lsn && bytes.Equal(file, seeds[i].data) {
				want = &seeds[i]
			}
		}

		b, err := openBase(vfs.OS, dir, name)
		if err != nil {
			if want != nil {
				t.Fatalf("openBase of the file written at LSN %d: %v", nameLSN, err)
			}
			if !errors.Is(err, basesnap.ErrBad) {
				t.Fatalf("openBase of a damaged file: %v does not wrap basesnap.ErrBad", err)
			}
			return
		}
		// What openBase accepts agrees with the file's name and size.
		if b.lsn != nameLSN || b.hdr.GetLsn() != nameLSN || b.name != name {
			t.Fatalf("openBase of %s: LSN %d, meta LSN %d, name %s", name, b.lsn, b.hdr.GetLsn(), b.name)
		}
		if b.bytes != int64(len(file)) {
			t.Fatalf("openBase: %d bytes, the file has %d", b.bytes, len(file))
		}
		if lo := int64(basesnap.PrefixSize + basesnap.CRCSize); b.stateOff < lo ||
			b.stateOff > b.bytes-basesnap.StateHeaderSize-basesnap.StateTrailerSize {
			t.Fatalf("openBase: the state starts at %d of %d bytes", b.stateOff, b.bytes)
		}
		if info := b.info(); info.Lsn != nameLSN || info.Epoch != b.hdr.GetEpoch() || info.Keys != b.hdr.GetKeys() ||
			info.Bytes != uint64(len(file)) || info.StateDigest != b.digest {
			t.Fatalf("info %v disagrees with the snapshot read (meta %v, digest %s)", info, b.hdr, b.digest)
		}

		var pairs []snapPair
		d, err := scanBase(vfs.OS, dir, b, func(k, v []byte, ver uint64) error {
			pairs = append(pairs, snapPair{bytes.Clone(k), bytes.Clone(v), ver})
			return nil
		})
		if err != nil {
			if want != nil {
				t.Fatalf("scanBase of the file written at LSN %d: %v", nameLSN, err)
			}
			if !errors.Is(err, basesnap.ErrBad) || !strings.Contains(err.Error(), name) {
				t.Fatalf("scanBase of a damaged file: %v does not wrap basesnap.ErrBad naming %s", err, name)
			}
			return
		}
		// What is accepted is self-consistent: the digest of the pairs is
		// the trailer's, and the pairs re-encode, with the meta's LSN and
		// count and that digest, to exactly the file's state part.
		if d.String() != b.digest {
			t.Fatalf("scanBase: the pairs' digest is %v, the trailer says %s", d, b.digest)
		}
		if uint64(len(pairs)) != b.hdr.GetKeys() {
			t.Fatalf("scanBase: %d pairs, the meta says %d", len(pairs), b.hdr.GetKeys())
		}
		var again bytes.Buffer
		enc := state.NewSnapshotEncoder(&again, nameLSN, uint64(len(pairs)))
		for _, p := range pairs {
			if err := enc.Add(p.key, p.value, p.version); err != nil {
				t.Fatalf("a pair scanned does not re-encode: %v", err)
			}
		}
		if _, err := enc.Finish(b.digest); err != nil {
			t.Fatalf("the pairs scanned do not re-encode with the trailer's digest: %v", err)
		}
		if !bytes.Equal(again.Bytes(), file[b.stateOff:]) {
			t.Fatalf("the pairs scanned re-encode to\n%x\nthe file's state part is\n%x", again.Bytes(), file[b.stateOff:])
		}

		if want == nil {
			return
		}
		// The writer's file reads back exactly as written.
		if !proto.Equal(b.hdr, want.meta) {
			t.Fatalf("meta %v, written %v", b.hdr, want.meta)
		}
		w := want.written
		if b.lsn != w.lsn || b.name != w.name || b.bytes != w.bytes || b.stateOff != w.stateOff || b.digest != w.digest || !proto.Equal(b.hdr, w.hdr) {
			t.Fatalf("openBase read %+v, writeSnapshot returned %+v", *b, *w)
		}
		if d != want.digest || b.digest != want.digest.String() {
			t.Fatalf("digest %v (trailer %s), written %v", d, b.digest, want.digest)
		}
		if len(pairs) != len(want.pairs) {
			t.Fatalf("%d pairs, written %d", len(pairs), len(want.pairs))
		}
		for i, p := range pairs {
			if w := want.pairs[i]; !bytes.Equal(p.key, w.key) || !bytes.Equal(p.value, w.value) || p.version != w.version {
				t.Fatalf("pair %d is %q=%q@%d, written %q=%q@%d", i, p.key, p.value, p.version, w.key, w.value, w.version)
			}
		}
	})
}
