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

// ErrNoEpochLeft is NextEpoch's error once MaxEpoch has been seen.
var ErrNoEpochLeft = errors.New("no epoch is left")

// CheckEpoch refuses an epoch above MaxEpoch; the error says which and
// the maximum (the caller names the field).
func CheckEpoch(e uint64) error {
	if e > MaxEpoch {
		return fmt.Errorf("%d is above the highest epoch, %d", e, MaxEpoch)
	}
	return nil
}

// NextEpoch is the epoch after seen (the highest epoch seen anywhere), or
// ErrNoEpochLeft when seen is MaxEpoch or above (a peer that states one is
// refused; a directory may still hold one written before the bound).
func NextEpoch(seen uint64) (uint64, error) {
	if seen >= MaxEpoch {
		return 0, fmt.Errorf("%w: the highest epoch seen, %d, is the maximum (%d)", ErrNoEpochLeft, seen, MaxEpoch)
	}
	return seen + 1, nil
}
