package wal

import (
	"errors"
	"fmt"
)

var (
	// ErrCorrupt is wrapped by every *CorruptionError.
	ErrCorrupt = errors.New("wal: corrupt log")
	// ErrCompacted reports that a requested LSN is older than the oldest
	// entry kept (by NewReader or TruncateAfter), or that the segment a
	// Reader needed was removed (by TruncateBefore or Reset) while it was
	// reading.
	ErrCompacted = errors.New("wal: requested LSN has been compacted")
	// ErrTruncated is returned by a Reader's Next when TruncateAfter removed
	// entries the Reader had returned or was to return next: its position no
	// longer exists, and new entries may reuse those LSNs. Create a new
	// Reader. Readers positioned at or before the cut are unaffected.
	ErrTruncated = errors.New("wal: log truncated after the reader's position")
	// ErrFuture reports that NewReader was asked to start beyond LastLSN()+1.
	ErrFuture = errors.New("wal: requested LSN is beyond the end of the log")
	// ErrClosed is returned by a closed Log or Reader.
	ErrClosed = errors.New("wal: closed")
	// ErrBroken is wrapped by the error of every Append, Sync, Reset,
	// TruncateBefore and TruncateAfter after a write or sync failed: the log's on-disk state is
	// then unknown, so it refuses to continue rather than retry (a failed
	// fsync may already have dropped the dirty pages). Reopen the log to
	// recover from what is on disk.
	ErrBroken = errors.New("wal: log is broken by an earlier I/O failure")
	// ErrNotContiguous is wrapped by Append's error for entries whose LSNs do
	// not continue the log.
	ErrNotContiguous = errors.New("wal: entries are not contiguous with the log")
)

// CorruptionError reports damage that recovery will not repair: anything
// other than a torn write at the tail of the newest segment. It wraps
// ErrCorrupt.
type CorruptionError struct {
	Segment string // path of the damaged segment file
	Offset  int64  // byte offset of the damage in that file
	Reason  string
}

// Error names the file and the offset of the damage.
func (e *CorruptionError) Error() string {
	return fmt.Sprintf("wal: corrupt segment %s at offset %d: %s", e.Segment, e.Offset, e.Reason)
}

// Unwrap returns ErrCorrupt.
func (e *CorruptionError) Unwrap() error { return ErrCorrupt }
