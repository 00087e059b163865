package replica

import (
	"bytes"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/keyspace"
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

// noteHeldRecords takes the newest epoch record in the written batches cs
// (decoded, not spilled) as held, if newer than the one held. Only
// batches of an epoch after the newest record's are looked into: an
// epoch's record is its first commit.
func (s *Server) noteHeldRecords(cs []checked) {
	for i := range cs {
		c := &cs[i]
		if c.spilled || c.env.GetEpoch() <= s.follower.recordEpoch {
			continue
		}
		if rec := epochRecordIn(&c.batch); rec != nil && rec.GetEpoch() > s.follower.recordEpoch {
			s.follower.recordEpoch = rec.GetEpoch()
			s.heldRecord.Store(rec)
		}
	}
}

// rescanHeldRecords recomputes the held record from the batches still
// unapplied, after a cut of the log took some away.
func (s *Server) rescanHeldRecords() {
	s.heldRecord.Store(nil)
	s.follower.recordEpoch = 0
	if rec, err := keyspace.EpochRecord(s.store.Load().Snapshot()); err == nil && rec != nil {
		s.follower.recordEpoch = rec.GetEpoch()
	}
	s.noteHeldRecords(s.follower.unapplied)
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
