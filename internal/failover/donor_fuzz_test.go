package failover

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/pkg/codec"
)

// Bits of FuzzCheckDonorBatch's payload flags.
const (
	// donorJSON encodes the payload with JSON instead of MsgPack.
	donorJSON = 1 << iota
	// donorGapBound checks the epoch against the bound of a log store's
	// batches (datadir.MaxEpochGap) instead of a primary's.
	donorGapBound
	// donorRaw encodes with donorPayload even where the codec could.
	donorRaw
	// donorCorrupt flips a payload byte.
	donorCorrupt
	// donorStaleCRC leaves the CRC as it was before the flip.
	donorStaleCRC
	// donorCRCFlipped changes the CRC.
	donorCRCFlipped
)

// Bits of FuzzCheckDonorBatch's envelope flags: each makes the envelope
// disagree with itself or with its payload.
const (
	// envFirstPlus1 puts first_lsn and prev_lsn one past the payload's.
	envFirstPlus1 = 1 << iota
	// envPrevWrong makes prev_lsn other than first_lsn-1.
	envPrevWrong
	// envLastPlus1 puts last_lsn one past the payload's.
	envLastPlus1
	// envOtherCodec names the other codec.
	envOtherCodec
	// envNoCodec names codec 0, unspecified.
	envNoCodec
)

// donorBatch turns fuzzer bytes into the records of a batch starting at LSN
// first. Each record is an op byte o, a txn byte x and a length byte l,
// then l&7 key bytes and l>>3&7 value bytes (fewer if data ends). The op is
// put for o&7 in 0..2, delete for 3, commit for 4 and 5, op 0 for 6 and
// op 4+o>>3 for 7. An even x keeps the previous record's TxnID (first to
// begin with), an odd one adds int8(x)>>1 to it. A delete's value and a
// commit's key and value are dropped unless l&0x40. LSNs are consecutive:
// both wire formats number records from the batch's first LSN.
func donorBatch(first uint64, data []byte) *codec.Batch {
	b := &codec.Batch{}
	txn := first
	take := func(n int) []byte {
		n = min(n, len(data))
		p := bytes.Clone(data[:n])
		data = data[n:]
		return p
	}
	for i := uint64(0); len(data) >= 3; i++ {
		o, x, l := data[0], data[1], data[2]
		data = data[3:]
		var op codec.Op
		switch o & 7 {
		case 0, 1, 2:
			op = codec.OpPut
		case 3:
			op = codec.OpDelete
		case 4, 5:
			op = codec.OpCommit
		case 6:
			op = 0
		default:
			op = codec.Op(4 + o>>3)
		}
		if x&1 != 0 {
			txn += uint64(int64(int8(x)) >> 1)
		}
		klen, vlen := int(l&7), int(l>>3&7)
		if l&0x40 == 0 {
			switch op {
			case codec.OpDelete:
				vlen = 0
			case codec.OpCommit:
				klen, vlen = 0, 0
			}
		}
		b.Records = append(b.Records, codec.Record{LSN: first + i, TxnID: txn, Op: op, Key: take(klen), Value: take(vlen)})
	}
	return b
}

// donorRecord encodes one record for donorBatch, for seeds.
func donorRecord(o, x byte, key, value string, malformed bool) []byte {
	l := byte(len(key)) | byte(len(value))<<3
	if malformed {
		l |= 0x40
	}
	return append(append([]byte{o, x, l}, key...), value...)
}

// donorPayload encodes b as codec id lays a batch out (docs/FORMAT.md,
// "Batch payload") without checking anything, so that a batch the codecs
// refuse to encode (an unknown op, a delete with a value, a commit with a
// key, LSNs past 2^64-1) reaches the decoder all the same. MsgPack integers
// take their longest forms, which a decoder must accept too.
func donorPayload(id codec.ID, first uint64, b *codec.Batch) []byte {
	if id == codec.IDJSON {
		type record struct {
			TxnID uint64 `json:"txn"`
			Op    string `json:"op"`
			Key   []byte `json:"key,omitempty"`
			Value []byte `json:"value,omitempty"`
		}
		jb := struct {
			Version  int      `json:"v"`
			FirstLSN uint64   `json:"first_lsn"`
			Records  []record `json:"records"`
		}{Version: 1, FirstLSN: first, Records: []record{}}
		for _, r := range b.Records {
			jb.Records = append(jb.Records, record{TxnID: r.TxnID, Op: r.Op.String(), Key: r.Key, Value: r.Value})
		}
		p, err := json.Marshal(&jb)
		if err != nil {
			panic(err) // every field marshals
		}
		return p
	}
	p := []byte{0x93, 0x01, 0xcf} // array(3), version 1, uint64
	p = binary.BigEndian.AppendUint64(p, first)
	p = binary.BigEndian.AppendUint32(append(p, 0xdd), uint32(len(b.Records))) // array32
	var prev uint64
	for _, r := range b.Records {
		n := 4 // put, and an unknown op
		switch {
		case r.Op == codec.OpDelete && len(r.Value) == 0:
			n = 3
		case r.Op == codec.OpCommit && len(r.Key) == 0 && len(r.Value) == 0:
			n = 2
		}
		p = append(p, 0x90|byte(n), 0xcc, byte(r.Op), 0xd3) // array(n), uint8 op, int64 txn delta
		p = binary.BigEndian.AppendUint64(p, r.TxnID-prev)
		prev = r.TxnID
		if n >= 3 {
			p = append(append(p, 0xc4, byte(len(r.Key))), r.Key...) // bin8
		}
		if n == 4 {
			p = append(append(p, 0xc4, byte(len(r.Value))), r.Value...)
		}
	}
	return p
}

// sameRecords reports whether a and b hold the same records; a nil and an
// empty key or value are the same (see codec.Record).
func sameRecords(a, b []codec.Record) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := &a[i], &b[i]
		if x.LSN != y.LSN || x.TxnID != y.TxnID || x.Op != y.Op || !bytes.Equal(x.Key, y.Key) || !bytes.Equal(x.Value, y.Value) {
			return false
		}
	}
	return true
}

// reasonSet is the set of reasons a refusal may give.
type reasonSet map[DonorReason]bool

// FuzzCheckDonorBatch: the donor-batch check, run on any batch and envelope
// as a candidate's copy runs it (CheckDonorBatch) and as a replica does
// (CheckDonorHead, then CheckDonorWhole into a reused batch), never panics;
// both ways give the same answer; a refusal is a *DonorError whose reason
// is one the batch warrants (a malformed envelope, a CRC mismatch, an
// epoch too far ahead or older than the log's, a gap, a payload that does
// not decode to whole transactions) with a message; a batch with none of
// those faults is accepted, decoded to the records encoded; and every
// batch accepted is one a store at the LSN before it applies.
func FuzzCheckDonorBatch(f *testing.F) {
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	const put, del, commit, opZero, opHigh = 0, 3, 4, 6, 7
	txn := cat(donorRecord(put, 0, "a", "1", false), donorRecord(put, 0, "", "", false),
		donorRecord(del, 0, "b", "", false), donorRecord(commit, 0, "", "", false))
	two := cat(txn, donorRecord(put, 3, "c", "3", false), donorRecord(commit, 0, "", "", false))
	seed := func(next, promise uint64, epochDelta int32, logDelta int16, firstDelta int8, flags, env uint8, corruptAt uint16, recs []byte) {
		f.Add(next, promise, epochDelta, logDelta, firstDelta, flags, env, corruptAt, recs)
	}
	// Good batches, each codec, both encodings, both bounds.
	seed(1, 1, 0, 0, 0, 0, 0, 0, two)
	seed(1, 1, 0, 0, 0, donorJSON, 0, 0, two)
	seed(41, 7, 1, -3, 0, donorRaw|donorGapBound, 0, 0, two)
	seed(41, 7, 1, -3, 0, donorRaw|donorJSON, 0, 0, two)
	seed(1<<40, 1<<30, 0, 0, 0, 0, 0, 0, donorRecord(commit, 0, "", "", false))
	// Not whole transactions: no trailing commit, a TxnID changing inside
	// one, no records.
	seed(1, 1, 0, 0, 0, 0, 0, 0, cat(donorRecord(put, 0, "a", "", false), donorRecord(put, 0, "b", "", false)))
	seed(1, 1, 0, 0, 0, 0, 0, 0, cat(donorRecord(put, 0, "a", "", false), donorRecord(put, 3, "b", "", false), donorRecord(commit, 0, "", "", false)))
	seed(1, 1, 0, 0, 0, 0, 0, 0, nil)
	// Records the codecs cannot hold: unknown ops, a delete with a value,
	// a commit with a key, LSNs past 2^64-1.
	seed(1, 1, 0, 0, 0, 0, 0, 0, cat(donorRecord(opZero, 0, "a", "", false), donorRecord(commit, 0, "", "", false)))
	seed(1, 1, 0, 0, 0, donorJSON, 0, 0, cat(donorRecord(opHigh|8, 0, "a", "", false), donorRecord(commit, 0, "", "", false)))
	seed(1, 1, 0, 0, 0, 0, 0, 0, cat(donorRecord(del, 0, "a", "v", true), donorRecord(commit, 0, "", "", false)))
	seed(1, 1, 0, 0, 0, donorJSON, 0, 0, cat(donorRecord(put, 0, "a", "", false), donorRecord(commit, 0, "k", "", true)))
	seed(1<<64-1, 1, 0, 0, 0, 0, 0, 0, txn)
	// Head faults: a gap, an overlap, an epoch too far ahead for each
	// bound, an epoch older than the log's, a CRC mismatch, a malformed
	// envelope.
	seed(5, 1, 0, 0, 1, 0, 0, 0, two)
	seed(5, 1, 0, 0, -1, 0, 0, 0, two)
	seed(1, 1, datadir.MaxEpochJump+1, -1, 0, 0, 0, 0, two)
	seed(1, 1, datadir.MaxEpochGap+1, -1, 0, donorGapBound, 0, 0, two)
	seed(1, 9, 0, 1, 0, 0, 0, 0, two)
	seed(1, 1, 0, 0, 0, donorCRCFlipped, 0, 0, two)
	seed(1, 1, 0, 0, 0, donorCorrupt|donorStaleCRC, 0, 7, two)
	seed(1, 1, 0, 0, 0, 0, envPrevWrong, 0, two)
	seed(1, 1, 0, 0, 0, 0, envNoCodec, 0, two)
	// The envelope disagreeing with its payload.
	seed(2, 1, 0, 0, -1, 0, envFirstPlus1, 0, two)
	seed(1, 1, 0, 0, 0, 0, envLastPlus1, 0, two)
	seed(1, 1, 0, 0, 0, donorJSON, envOtherCodec, 0, two)
	seed(1, 1, 0, 0, 0, 0, envOtherCodec, 0, two)
	// A payload byte changed, the CRC recomputed: the decoders' turn.
	seed(1, 1, 0, 0, 0, donorCorrupt, 0, 0x0109, two)
	seed(1, 1, 0, 0, 0, donorCorrupt|donorJSON, 0, 0x2030, two)

	f.Fuzz(func(t *testing.T, next, promise uint64, epochDelta int32, logDelta int16, firstDelta int8, flags, envFlags uint8, corruptAt uint16, recs []byte) {
		// The batch as the donor encoded it.
		first := next + uint64(int64(firstDelta))
		built := donorBatch(first, recs)
		c := codec.Codec(codec.MsgPack)
		if flags&donorJSON != 0 {
			c = codec.JSON
		}
		payload, encErr := c.AppendBatch(nil, built)
		if encErr != nil || flags&donorRaw != 0 {
			payload = donorPayload(c.ID(), first, built)
		}
		crc := codec.Checksum(payload)
		corrupted := flags&donorCorrupt != 0 && len(payload) > 0
		if corrupted {
			payload[int(corruptAt)%len(payload)] ^= byte(corruptAt>>8) | 1
		}
		switch {
		case flags&donorCRCFlipped != 0:
			crc ^= 1
		case flags&donorStaleCRC == 0:
			crc = codec.Checksum(payload)
		}
		epoch := promise + uint64(int64(epochDelta))
		logEpoch := epoch + uint64(int64(logDelta))
		bound := uint64(datadir.MaxEpochJump)
		if flags&donorGapBound != 0 {
			bound = datadir.MaxEpochGap
		}
		env := &walshipv1.WalBatch{
			Epoch:    epoch,
			FirstLsn: first,
			LastLsn:  first, // an empty batch still claims one LSN
			PrevLsn:  first - 1,
			Codec:    walshipv1.Codec(c.ID()),
			Payload:  payload,
			Crc32C:   crc,
		}
		if len(built.Records) > 0 {
			env.LastLsn = built.LastLSN()
		}
		if envFlags&envFirstPlus1 != 0 {
			env.FirstLsn++
			env.PrevLsn++
		}
		if envFlags&envPrevWrong != 0 {
			env.PrevLsn ^= 1
		}
		if envFlags&envLastPlus1 != 0 {
			env.LastLsn++
		}
		switch {
		case envFlags&envNoCodec != 0:
			env.Codec = walshipv1.Codec_CODEC_UNSPECIFIED
		case envFlags&envOtherCodec != 0:
			env.Codec = walshipv1.Codec(codec.IDMsgPack + codec.IDJSON - c.ID())
		}

		// What the batch warrants, in the check's own terms.
		want := reasonSet{}
		if env.FirstLsn == 0 || env.LastLsn < env.FirstLsn || env.PrevLsn != env.FirstLsn-1 || env.Codec != walshipv1.Codec_CODEC_MSGPACK && env.Codec != walshipv1.Codec_CODEC_JSON {
			want[DonorDecode] = true
		}
		if crc != codec.Checksum(payload) {
			want[DonorCRC] = true
		}
		if epoch > datadir.MaxEpoch || epoch > promise && epoch-promise > bound {
			want[DonorEpochAhead] = true
		}
		if epoch < logEpoch {
			want[DonorEpochStale] = true
		}
		if env.FirstLsn != next {
			want[DonorGap] = true
		}
		// A head that passes leaves the payload: the batch encoded, if the
		// envelope describes it, must be accepted exactly when it is whole
		// transactions of records the codecs can hold; a changed payload
		// may decode to anything, or to nothing.
		unknown := false
		if len(want) == 0 {
			envFits := env.FirstLsn == first && env.LastLsn == built.LastLSN() && env.Codec == walshipv1.Codec(c.ID())
			switch {
			case corrupted:
				unknown = true
			case !envFits || encErr != nil || state.CheckBatch(built) != nil:
				want[DonorDecode] = true
			}
		}

		var b codec.Batch
		err := CheckDonorBatch(env, next, logEpoch, promise, bound, &b)
		// The replica's way, decoding into a batch holding an earlier
		// batch's records.
		reused := codec.Batch{Records: make([]codec.Record, 3, 64)}
		for i := range reused.Records {
			reused.Records[i] = codec.Record{LSN: 99 + uint64(i), TxnID: 7, Op: codec.OpPut, Key: []byte("stale"), Value: []byte("record")}
		}
		err2 := CheckDonorHead(env, next, logEpoch, promise, bound)
		if err2 == nil {
			err2 = CheckDonorWhole(env, &reused)
		}

		for _, e := range []error{err, err2} {
			if e == nil {
				continue
			}
			var de *DonorError
			if !errors.As(e, &de) {
				t.Fatalf("refusal %v (%T) is not a *DonorError", e, e)
			}
			if de.Reason < DonorDecode || de.Reason > DonorGap || de.Err == nil || de.Error() == "" {
				t.Fatalf("refusal with reason %d, error %v: no reason or no message", de.Reason, de.Err)
			}
			if !want[de.Reason] && !(unknown && de.Reason == DonorDecode) {
				t.Fatalf("refused with reason %d (%v); the batch warrants %v (envelope %v, next %d, log epoch %d, promise %d, bound %d, records %+v)",
					de.Reason, de, want, env, next, logEpoch, promise, bound, built.Records)
			}
		}
		if (err == nil) != (err2 == nil) {
			t.Fatalf("CheckDonorBatch: %v; CheckDonorHead and CheckDonorWhole: %v", err, err2)
		}
		if err != nil {
			var de, de2 *DonorError
			errors.As(err, &de)
			errors.As(err2, &de2)
			if de.Reason != de2.Reason {
				t.Fatalf("CheckDonorBatch refused with reason %d (%v), CheckDonorHead and CheckDonorWhole with %d (%v)", de.Reason, de, de2.Reason, de2)
			}
			return
		}
		if len(want) > 0 {
			t.Fatalf("accepted a batch that warrants %v (envelope %v, next %d, log epoch %d, promise %d, bound %d, records %+v)",
				want, env, next, logEpoch, promise, bound, built.Records)
		}
		if !unknown && !sameRecords(b.Records, built.Records) {
			t.Fatalf("decoded %+v, encoded %+v", b.Records, built.Records)
		}
		if !sameRecords(reused.Records, b.Records) {
			t.Fatalf("decoded into a reused batch %+v, into a new one %+v", reused.Records, b.Records)
		}

		// What the check promises: a store at the LSN before the batch
		// applies it.
		s, err := state.NewBuilder(next-1).Finish(0, state.Digest{}.String())
		if err != nil {
			t.Fatalf("an empty store at LSN %d: %v", next-1, err)
		}
		if err := s.Apply(&b); err != nil {
			t.Fatalf("accepted batch %d..%d (records %+v) does not apply after LSN %d: %v", env.FirstLsn, env.LastLsn, b.Records, next-1, err)
		}
		if s.AppliedLSN() != env.LastLsn {
			t.Fatalf("applied LSN %d after batch %d..%d", s.AppliedLSN(), env.FirstLsn, env.LastLsn)
		}
	})
}
