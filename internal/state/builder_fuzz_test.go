package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/walship/walship/pkg/codec"
)

// Version codes of decodeBuilderPairs: a pair's version byte is its version,
// except for these, which name the versions around the builder's LSN.
const (
	// verMax is math.MaxUint64.
	verMax = 0xfd
	// verLSNMinus1 is lsn-1, wrapping at 0.
	verLSNMinus1 = 0xfc
	// verLSN is lsn.
	verLSN = 0xfe
	// verLSNPlus1 is lsn+1, wrapping at 2^64-1.
	verLSNPlus1 = 0xff
)

// decodeBuilderPairs turns fuzzer bytes into the pairs a sender streams to a
// Builder at applied LSN lsn. Each pair is a header byte h, a version byte
// and then h&7 key bytes and h>>3&7 value bytes (fewer if data ends). With
// h&0x80 the key bytes are appended to the previous key instead of making a
// key of their own, so that ascending runs (a longer key after its prefix)
// and duplicates (nothing appended) are common. Keys may be empty, out of
// order or repeated and versions 0 or past lsn: the Builder must refuse
// those, not the decoder.
func decodeBuilderPairs(data []byte, lsn uint64) []kv {
	var (
		pairs []kv
		prev  string
	)
	take := func(n int) string {
		n = min(n, len(data))
		s := string(data[:n])
		data = data[n:]
		return s
	}
	for len(data) >= 2 {
		h, vc := data[0], data[1]
		data = data[2:]
		var ver uint64
		switch vc {
		case verMax:
			ver = math.MaxUint64
		case verLSNMinus1:
			ver = lsn - 1
		case verLSN:
			ver = lsn
		case verLSNPlus1:
			ver = lsn + 1
		default:
			ver = uint64(vc)
		}
		key := take(int(h & 7))
		if h&0x80 != 0 {
			key = prev + key
		}
		pairs = append(pairs, kv{k: key, v: take(int(h >> 3 & 7)), ver: ver})
		prev = key
	}
	return pairs
}

// builderPair encodes one pair for decodeBuilderPairs, for seeds; key and
// value are at most 7 bytes.
func builderPair(extend bool, key, value string, vc byte) []byte {
	h := byte(len(key)) | byte(len(value))<<3
	if extend {
		h |= 0x80
	}
	return append(append([]byte{h, vc}, key...), value...)
}

// specDigest computes the digest of pairs from its specification
// (docs/FORMAT.md, "Digest"), independently of the store's hasher.
func specDigest(pairs []kv) Digest {
	var d Digest
	for _, p := range pairs {
		var msg []byte
		msg = binary.LittleEndian.AppendUint64(msg, uint64(len(p.k)))
		msg = append(msg, p.k...)
		msg = binary.LittleEndian.AppendUint64(msg, p.ver)
		msg = binary.LittleEndian.AppendUint64(msg, uint64(len(p.v)))
		msg = append(msg, p.v...)
		sum := sha256.Sum256(msg)
		for i := range d.lanes {
			d.lanes[i] += binary.LittleEndian.Uint64(sum[i*8:])
		}
	}
	return d
}

// maxApplyLSN bounds the LSN storeByApply builds up to, so that a fuzzed
// LSN of billions does not make one input take billions of records.
const maxApplyLSN = 1024

// storeByApply builds a store holding pairs at applied LSN lsn the way a
// primary does, with Store.Apply: one transaction per version, committing at
// that LSN (so that the version Apply gives its keys is that one), and a
// lone commit at every other LSN up to lsn. It reports false, building
// nothing, when lsn is past maxApplyLSN or the versions leave no room for
// that: k keys of version v need the k LSNs before v for their puts.
func storeByApply(t *testing.T, pairs []kv, lsn uint64) (*Store, bool) {
	t.Helper()
	if lsn > maxApplyLSN {
		return nil, false
	}
	byVersion := map[uint64][]kv{}
	for _, p := range pairs {
		byVersion[p.ver] = append(byVersion[p.ver], p)
	}
	versions := make([]uint64, 0, len(byVersion))
	for v := range byVersion {
		versions = append(versions, v)
	}
	slices.Sort(versions)
	b := &codec.Batch{}
	next := uint64(1) // the next LSN to fill
	commitsUpTo := func(end uint64) {
		for ; next < end; next++ {
			b.Records = append(b.Records, codec.Record{LSN: next, TxnID: next, Op: codec.OpCommit})
		}
	}
	for _, v := range versions {
		group := byVersion[v]
		if v < next+uint64(len(group)) {
			return nil, false
		}
		commitsUpTo(v - uint64(len(group)))
		for _, p := range group {
			b.Records = append(b.Records, codec.Record{LSN: next, TxnID: v, Op: codec.OpPut, Key: []byte(p.k), Value: []byte(p.v)})
			next++
		}
		b.Records = append(b.Records, codec.Record{LSN: v, TxnID: v, Op: codec.OpCommit})
		next = v + 1
	}
	commitsUpTo(lsn + 1)
	s := New()
	if len(b.Records) > 0 {
		mustApply(t, s, b)
	}
	return s, true
}

// FuzzBuilder: a Builder at any LSN, fed any sequence of pairs, refuses with
// ErrCorruptSnapshot, and an error naming the key, exactly the first pair
// whose key does not follow the previous one (out of order or a duplicate)
// or whose version is outside 1..LSN, and refuses in Finish a count or a
// digest other than those of the pairs added. A store it accepts holds
// exactly the pairs given, copied, at the LSN given, with the digest their
// specification gives, the digest a store built by Apply with the same
// content has, and it round-trips through WriteSnapshot and ReadSnapshot
// and applies the next batch.
func FuzzBuilder(f *testing.F) {
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	// A valid snapshot: "", "a", "ab", "b" at versions 1..10.
	valid := cat(builderPair(false, "", "e", 1), builderPair(false, "a", "1", 10),
		builderPair(true, "b", "", 3), builderPair(false, "b", "22", verLSN))
	f.Add(uint64(10), valid, int8(0), uint8(0))
	f.Add(uint64(10), valid, int8(1), uint8(0))  // one pair more announced
	f.Add(uint64(10), valid, int8(-1), uint8(0)) // one pair fewer
	f.Add(uint64(10), valid, int8(0), uint8(1))  // a digit of the digest changed
	f.Add(uint64(10), valid, int8(0), uint8(2))  // no digest
	f.Add(uint64(10), valid, int8(0), uint8(3))  // the digest without the last pair
	f.Add(uint64(0), []byte{}, int8(0), uint8(0))
	f.Add(uint64(math.MaxUint64), cat(builderPair(false, "k", "v", verMax), builderPair(true, "z", "", verLSNMinus1)), int8(0), uint8(0))
	// Versions Apply can reproduce: two keys at 3, one at 5, LSN 7.
	f.Add(uint64(7), cat(builderPair(false, "a", "x", 3), builderPair(false, "c", "y", 5), builderPair(false, "d", "", 3)), int8(0), uint8(0))
	// Refusals: out of order, a duplicate, an empty key after the first,
	// version 0, version past the LSN.
	f.Add(uint64(10), cat(builderPair(false, "b", "", 1), builderPair(false, "a", "", 1)), int8(0), uint8(0))
	f.Add(uint64(10), cat(builderPair(false, "a", "1", 1), builderPair(true, "", "2", 2)), int8(0), uint8(0))
	f.Add(uint64(10), cat(builderPair(false, "a", "", 1), builderPair(false, "", "", 1)), int8(0), uint8(0))
	f.Add(uint64(10), cat(builderPair(false, "a", "", 0)), int8(0), uint8(0))
	f.Add(uint64(10), cat(builderPair(false, "a", "", 1), builderPair(false, "b", "", verLSNPlus1)), int8(0), uint8(0))

	f.Fuzz(func(t *testing.T, lsn uint64, data []byte, countDelta int8, digestMode uint8) {
		pairs := decodeBuilderPairs(data, lsn)
		b := NewBuilder(lsn)
		// Each pair is passed in one buffer, scribbled over once Add
		// returns, as a stream reuses its chunks: the Builder must copy.
		var buf []byte
		for i, p := range pairs {
			buf = append(append(buf[:0], p.k...), p.v...)
			key, value := buf[:len(p.k):len(p.k)], buf[len(p.k):]
			err := b.Add(key, value, p.ver)
			for j := range buf {
				buf[j] = 0xa5
			}
			outOfOrder := i > 0 && p.k <= pairs[i-1].k
			badVersion := p.ver == 0 || p.ver > lsn
			if !outOfOrder && !badVersion {
				if err != nil {
					t.Fatalf("LSN %d: Add(%q, %q, %d), pair %d, refused after %q: %v", lsn, p.k, p.v, p.ver, i, prevKey(pairs, i), err)
				}
				continue
			}
			if err == nil {
				t.Fatalf("LSN %d: Add(%q, %q, %d), pair %d, accepted after %q (out of order: %t, version outside 1..%d: %t)",
					lsn, p.k, p.v, p.ver, i, prevKey(pairs, i), outOfOrder, lsn, badVersion)
			}
			if !errors.Is(err, ErrCorruptSnapshot) {
				t.Fatalf("Add(%q, _, %d) at LSN %d: %v does not wrap ErrCorruptSnapshot", p.k, p.ver, lsn, err)
			}
			if !strings.Contains(err.Error(), strconv.Quote(p.k)) {
				t.Fatalf("Add(%q, _, %d) at LSN %d: %q does not name the key", p.k, p.ver, lsn, err)
			}
			return // a refused snapshot is abandoned, as every caller does
		}

		want := specDigest(pairs)
		count := uint64(len(pairs)) + uint64(int64(countDelta))
		announced := want.String()
		switch digestMode % 4 {
		case 1:
			// Change one hex digit, chosen by the fuzzer, to another.
			i := int(digestMode>>2) % len(announced)
			digit := (strings.IndexByte("0123456789abcdef", announced[i]) + 1) % 16
			announced = announced[:i] + "0123456789abcdef"[digit:digit+1] + announced[i+1:]
		case 2:
			announced = ""
		case 3:
			if len(pairs) > 0 {
				announced = specDigest(pairs[:len(pairs)-1]).String()
			}
		}
		wrongCount, wrongDigest := count != uint64(len(pairs)), announced != want.String()
		st, err := b.Finish(count, announced)
		if wrongCount || wrongDigest {
			if err == nil {
				t.Fatalf("Finish(%d, %q) after %d pairs with digest %v accepted", count, announced, len(pairs), want)
			}
			if !errors.Is(err, ErrCorruptSnapshot) {
				t.Fatalf("Finish(%d, %q): %v does not wrap ErrCorruptSnapshot", count, announced, err)
			}
			says := wrongCount && strings.Contains(err.Error(), strconv.FormatUint(count, 10)) ||
				wrongDigest && strings.Contains(err.Error(), want.String())
			if !says {
				t.Fatalf("Finish(%d, %q) after %d pairs with digest %v: %q names neither the count nor the digest", count, announced, len(pairs), want, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Finish(%d, %v) after %d pairs at LSN %d: %v", count, announced, len(pairs), lsn, err)
		}

		if st.AppliedLSN() != lsn || st.Len() != len(pairs) {
			t.Fatalf("store at LSN %d with %d keys, want %d and %d", st.AppliedLSN(), st.Len(), lsn, len(pairs))
		}
		for _, p := range pairs {
			v, ver, ok := st.Get([]byte(p.k))
			if !ok || string(v) != p.v || ver != p.ver {
				t.Fatalf("Get(%q) = %q, %d, %t; want %q, %d", p.k, v, ver, ok, p.v, p.ver)
			}
		}
		if got := dump(st); !equalKV(got, pairs) {
			t.Fatalf("store holds %v, want %v", got, pairs)
		}
		if st.Digest() != want {
			t.Fatalf("digest %v, the pairs' is %v", st.Digest(), want)
		}
		if applied, ok := storeByApply(t, pairs, lsn); ok {
			if applied.Digest() != st.Digest() || !equalKV(dump(applied), pairs) {
				t.Fatalf("store built by Apply: digest %v, %v; built: %v, %v", applied.Digest(), dump(applied), st.Digest(), pairs)
			}
		}

		snap := encode(t, st.Snapshot())
		read, err := ReadSnapshot(bytes.NewReader(snap), int64(len(snap)))
		if err != nil {
			t.Fatalf("ReadSnapshot of the built store: %v", err)
		}
		if read.AppliedLSN() != lsn || read.Digest() != want || !equalKV(dump(read), pairs) {
			t.Fatalf("round trip: LSN %d digest %v %v; want %d %v %v", read.AppliedLSN(), read.Digest(), dump(read), lsn, want, pairs)
		}

		// The built store goes on applying the WAL from the next LSN.
		if lsn < math.MaxUint64-1 {
			mustApply(t, st, batch(lsn+1, txn(put("next", "v"))))
			if v, ver, ok := st.Get([]byte("next")); !ok || string(v) != "v" || ver != lsn+2 {
				t.Fatalf("after applying LSNs %d..%d: Get(next) = %q, %d, %t", lsn+1, lsn+2, v, ver, ok)
			}
		}
	})
}

// prevKey is the key of the pair before pairs[i], for messages.
func prevKey(pairs []kv, i int) string {
	if i == 0 {
		return "(none)"
	}
	return pairs[i-1].k
}
