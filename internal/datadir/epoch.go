package datadir

import (
	"errors"
	"fmt"
	"math"
)

// MaxEpoch is the highest epoch walship accepts from a peer or begins:
// 2^63-1, so that an epoch fits an int64 wherever it goes (a JSON number
// in another language, a signed column) and the epoch after every one seen
// is always representable. Epochs grow by one per primary start or
// promotion; an epoch above it is a bad argument, never wrapped to 0 (a
// promotion to 2^64-1 once made every later one ask for epoch 0).
const MaxEpoch uint64 = math.MaxInt64

// MaxEpochJump and MaxEpochGap bound how far above the newest epoch a
// node knows (its promise, or a primary's own epoch) an epoch from
// outside may be (CheckEpoch). MaxEpoch alone let one message take the
// last epoch: an Append heartbeat of epoch 2^63-1 from any node
// certificate made a log store promise it, the primary was refused and
// stepped down, and every later promotion needed an epoch above the
// maximum.
//
// Epochs grow by one per election (a primary's start, a promotion), and
// an honest peer is ahead of a node by the elections the node missed: a
// few. Two bounds apply:
//
//   - MaxEpochJump (2^20) bounds what a message makes a node promise or
//     write: a fence, an Append heartbeat or batch, a primary's
//     heartbeat or batch, a snapshot header, a hello, an admin's
//     PromoteRequest.epoch. One message moves a node's epoch by at most
//     2^20, so using up the 2^63 epochs takes 2^43 accepted messages.
//   - MaxEpochGap (2^30) bounds what a node believes from the peers it
//     asks itself — its log stores' Status and fence answers, a refill
//     peer, a promotion's survey: how far it catches up at once with a
//     cluster that moved on while it was away. A candidate fences a node
//     that is further behind than MaxEpochJump in steps of it
//     (EpochSteps), and a primary so fences a log store its heartbeat is
//     too far ahead of: one accepted message puts a node up to 2^20 ahead
//     of the others, and the next epoch must still be granted by them.
//
// A node that knows no epoch yet (known 0: a new cluster, an emptied
// directory) is bounded the same way: it catches up with a cluster of up
// to 2^30 epochs (a billion elections), beyond which an operator seeds
// its vote file (docs/RUNBOOK.md).
const (
	MaxEpochJump = 1 << 20
	MaxEpochGap  = 1 << 30
)

// CheckEpoch is the rule for every epoch that comes from outside: at
// most MaxEpoch, and at most bound (MaxEpochJump or MaxEpochGap) above
// known, the newest epoch the receiver knows. The error says which bound
// and its value; the caller names the field. An epoch at or below known
// passes: whether an older one is stale is each receiver's own rule.
func CheckEpoch(e, known, bound uint64) error {
	switch {
	case e > MaxEpoch:
		return fmt.Errorf("%d is above the highest epoch, %d", e, MaxEpoch)
	case e > known && e-known > bound:
		what := "the most a node catches up by at once"
		if bound == MaxEpochJump {
			what = "the most one message may move an epoch"
		}
		return fmt.Errorf("%d is more than %d (%s) above %d, the newest epoch known here", e, bound, what, known)
	}
	return nil
}

// EpochSteps are the epochs to fence a node that has promised from with,
// in increasing order, before to itself, so that none is more than
// MaxEpochJump above the node's promise when it comes: none when to is
// within the jump of from, nil too when to is more than MaxEpochGap above
// from (it is not bridged: the fence of to is refused).
func EpochSteps(from, to uint64) []uint64 {
	if to <= from || to-from <= MaxEpochJump || to-from > MaxEpochGap+MaxEpochJump {
		return nil
	}
	var steps []uint64
	for e := from + MaxEpochJump; e < to; e += MaxEpochJump {
		steps = append(steps, e)
	}
	return steps
}

// ErrNoEpochLeft is NextEpoch's error once MaxEpoch has been seen.
var ErrNoEpochLeft = errors.New("no epoch is left")

// NextEpoch is the epoch after seen (the highest epoch seen anywhere), or
// ErrNoEpochLeft when seen is MaxEpoch or above (a peer that states one is
// refused; a directory may still hold one written before the bound).
func NextEpoch(seen uint64) (uint64, error) {
	if seen >= MaxEpoch {
		return 0, fmt.Errorf("%w: the highest epoch seen, %d, is the maximum (%d)", ErrNoEpochLeft, seen, MaxEpoch)
	}
	return seen + 1, nil
}
