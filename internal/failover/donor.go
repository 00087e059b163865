package failover

import (
	"errors"
	"fmt"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/pkg/codec"
)

// DonorReason is why a batch copied from a donor was refused.
type DonorReason int

// The reasons CheckDonorHead and CheckDonorWhole refuse a batch.
const (
	// DonorDecode: an empty message, a malformed envelope, or a payload
	// that does not decode or holds no whole transactions.
	DonorDecode DonorReason = iota + 1
	// DonorCRC: the payload does not match its checksum.
	DonorCRC
	// DonorEpochAhead: the batch's epoch is beyond the bound (I9).
	DonorEpochAhead
	// DonorEpochStale: the batch's epoch is older than the log's newest
	// (I3): the donor's log and this one part earlier than thought.
	DonorEpochStale
	// DonorGap: the batch does not start right after the log's end.
	DonorGap
)

// DonorError is a refused donor batch.
type DonorError struct {
	Reason DonorReason
	Err    error
}

func (e *DonorError) Error() string { return e.Err.Error() }
func (e *DonorError) Unwrap() error { return e.Err }

// CheckDonorHead checks a batch copied from a donor (or streamed by a
// primary) against the log it is to continue, without decoding it: the
// envelope and its CRC, its epoch at most bound above known (the
// receiver's promise, or the epoch a promotion opens), not older than
// logEpoch (the newest of the log, I3), and its first LSN next.
func CheckDonorHead(env *walshipv1.WalBatch, next, logEpoch, known, bound uint64) error {
	if env == nil {
		return &DonorError{Reason: DonorDecode, Err: errors.New("empty batch message")}
	}
	if err := envelope.Verify(env); err != nil {
		reason := DonorDecode
		if errors.Is(err, envelope.ErrChecksum) {
			reason = DonorCRC
		}
		return &DonorError{Reason: reason, Err: err}
	}
	if err := datadir.CheckEpoch(env.GetEpoch(), known, bound); err != nil {
		return &DonorError{Reason: DonorEpochAhead, Err: fmt.Errorf("LSNs %d..%d: batch.epoch: %w", env.GetFirstLsn(), env.GetLastLsn(), err)}
	}
	if env.GetEpoch() < logEpoch {
		return &DonorError{Reason: DonorEpochStale, Err: fmt.Errorf("LSNs %d..%d are from epoch %d, this log has seen epoch %d",
			env.GetFirstLsn(), env.GetLastLsn(), env.GetEpoch(), logEpoch)}
	}
	if env.GetFirstLsn() != next {
		return &DonorError{Reason: DonorGap, Err: fmt.Errorf("batch starts at LSN %d, want %d", env.GetFirstLsn(), next)}
	}
	return nil
}

// CheckDonorWhole decodes a batch whose head passed into b and checks that
// the state could apply it: whole transactions only. A batch that fails is
// refused here, not stored and then fatal at every apply.
func CheckDonorWhole(env *walshipv1.WalBatch, b *codec.Batch) error {
	if err := envelope.DecodePayload(env, b); err != nil {
		return &DonorError{Reason: DonorDecode, Err: err}
	}
	if err := state.CheckBatch(b); err != nil {
		return &DonorError{Reason: DonorDecode, Err: err}
	}
	return nil
}

// CheckDonorBatch is CheckDonorHead and CheckDonorWhole: the one check of
// a batch copied from a donor, used by a replica's catch-up and a
// candidate's copy alike.
func CheckDonorBatch(env *walshipv1.WalBatch, next, logEpoch, known, bound uint64, b *codec.Batch) error {
	if err := CheckDonorHead(env, next, logEpoch, known, bound); err != nil {
		return err
	}
	return CheckDonorWhole(env, b)
}
