package replica

import (
	"bytes"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/protobuf/proto"
)

// A replica reports the contract of the newest epoch record in its log
// (EpochRecord), not only of the one it applied: a batch it wrote waits,
// unapplied, until the primary reports it durable, and after a restart
// that wait starts again from the applied marker, which may be behind
// what the replica had applied (replica.go). A primary whose epoch record
// changes the contract opens once the previous contract's members have
// it (services/primary contractchange.go); if one of them restarted and
// judged a promotion under the older contract only, its quorum could miss
// every node that acknowledged a write under the new one. Reporting a
// record it may still cut (a diverged tail) is only stricter: a promotion
// then also needs that contract's quorum.

var epochRecordKey = []byte(keyspace.EpochRecordKey)

// EpochRecords is what EpochRecord chooses from: the applied state's
// epoch record (nil if none) and the LSN the state has applied, and the
// newest record held past that LSN (nil if none). A promotion that cuts
// its log's tail needs the parts: a held record may be in the tail cut.
func (s *Server) EpochRecords() (applied *walshipv1.EpochRecord, appliedLSN uint64, held *walshipv1.EpochRecord) {
	v := s.store.Load().Snapshot()
	appliedLSN = v.AppliedLSN()
	if h := s.heldRecord.Load(); h != nil && h.lsn > appliedLSN {
		held = h.rec
	}
	if rec, err := keyspace.EpochRecord(v); err == nil {
		applied = rec
	}
	return applied, appliedLSN, held
}

// heldEpochRecord is an epoch record in a batch written but not applied, and
// the batch's last LSN: it is the log's newest record while the state has
// not applied that far.
type heldEpochRecord struct {
	rec *walshipv1.EpochRecord
	lsn uint64
}

// noteHeldRecords takes the newest epoch record in the written batches cs
// (decoded, not spilled), in log order, as held. Every batch is looked
// into: a membership change writes records of the epoch the state has
// one of already (learner, joint, final).
func (s *Server) noteHeldRecords(cs []checked) {
	if h := newestHeldRecord(cs); h != nil {
		s.heldRecord.Store(h)
	}
}

// rescanHeldRecords recomputes the held record from the batches still
// unapplied: after a cut of the log took some away, and after recovery,
// whose memory bound may have left batches in the WAL only. A spilled
// batch is read back to be looked into: one the memory bound left out
// still holds its record, and reporting an older one would let a
// promotion judge under a weaker contract. It stores the result once:
// EpochRecord, read meanwhile by a promotion's survey or fence, never
// sees no held record while one is (it would report the applied state's,
// older, contract).
func (s *Server) rescanHeldRecords() {
	h, err := s.heldRecordIn(s.follower.unapplied)
	if err != nil {
		// Applying the batch reads it back too, and stops there.
		s.logger.Warn("cannot read a spilled batch back to look for an epoch record", "err", err)
	}
	s.heldRecord.Store(h)
}

// heldRecordIn is newestHeldRecord over cs, spilled batches read back
// from the WAL (left spilled in cs).
func (s *Server) heldRecordIn(cs []checked) (*heldEpochRecord, error) {
	var rd *wal.Reader
	defer func() {
		if rd != nil {
			rd.Close()
		}
	}()
	var h *heldEpochRecord
	for i := range cs {
		c := cs[i] // a copy: a spilled batch stays spilled
		if c.spilled {
			if err := s.unspill(&rd, &c); err != nil {
				return h, err
			}
		}
		if found := newestHeldRecord([]checked{c}); found != nil {
			h = found
		}
	}
	return h, nil
}

// newestHeldRecord is the newest epoch record in the batches cs (decoded,
// not spilled) with its batch's last LSN, or nil.
func newestHeldRecord(cs []checked) *heldEpochRecord {
	var h *heldEpochRecord
	for i := range cs {
		c := &cs[i]
		if c.spilled {
			continue
		}
		if rec := epochRecordIn(&c.batch); rec != nil {
			h = &heldEpochRecord{rec: rec, lsn: c.env.GetLastLsn()}
		}
	}
	return h
}

// epochRecordIn is the last epoch record b puts (nil if none, or if it
// does not decode: the apply will say so).
func epochRecordIn(b *codec.Batch) *walshipv1.EpochRecord {
	var found *walshipv1.EpochRecord
	for _, r := range b.Records {
		if r.Op != codec.OpPut || !bytes.Equal(r.Key, epochRecordKey) {
			continue
		}
		rec := &walshipv1.EpochRecord{}
		if proto.Unmarshal(r.Value, rec) == nil {
			found = rec
		}
	}
	return found
}
