// Package keyspace is the rules of the replicated key space: which keys
// clients may use ([ValidateKey]), and the keys walship reserves for itself
// — the epoch record that the first commit of every epoch writes
// ([EpochRecordKey], [EpochRecord]).
package keyspace

import (
	"fmt"
	"unicode/utf8"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/state"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// MaxKeyBytes is the longest key.
const MaxKeyBytes = 4096

// ValidateKey checks a key: 1..MaxKeyBytes bytes of valid UTF-8. The error
// is an InvalidArgument status naming field.
func ValidateKey(field, key string) error {
	switch {
	case len(key) == 0:
		return status.Errorf(codes.InvalidArgument, "%s: must not be empty", field)
	case len(key) > MaxKeyBytes:
		return status.Errorf(codes.InvalidArgument, "%s: %d bytes, the limit is %d", field, len(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return status.Errorf(codes.InvalidArgument, "%s: not valid UTF-8", field)
	case key[0] == ReservedPrefix[0]:
		return status.Errorf(codes.InvalidArgument, "%s: keys starting with U+0000 are reserved for walship itself", field)
	}
	return nil
}

// ReservedPrefix starts the keys walship keeps in the replicated state for
// itself (the epoch record): clients cannot read or write them, and a
// Scan skips them.
const ReservedPrefix = "\x00"

// EpochRecordKey holds the EpochRecord of the current epoch: the first
// commit of every epoch writes it, so that every node that applied the log
// knows the primary and the contract.
const EpochRecordKey = ReservedPrefix + "walship/epoch"

// EpochRecord reads the epoch record from v (nil if there is none yet).
func EpochRecord(v *state.View) (*walshipv1.EpochRecord, error) {
	b, _, ok := v.Get([]byte(EpochRecordKey))
	if !ok {
		return nil, nil
	}
	rec := &walshipv1.EpochRecord{}
	if err := proto.Unmarshal(b, rec); err != nil {
		return nil, fmt.Errorf("epoch record: %w", err)
	}
	return rec, nil
}

// UserKeys is how many keys of v are clients': all but walship's own
// (ReservedPrefix), which no client can read or write.
func UserKeys(v *state.View) uint64 {
	reserved := 0
	v.Scan([]byte(ReservedPrefix), []byte{ReservedPrefix[0] + 1}, 0, func(_, _ []byte, _ uint64) bool {
		reserved++
		return true
	})
	return uint64(v.Len() - reserved)
}
