// Package wal is walship's segmented write-ahead log, used by the primary, the
// replicas and the log store. Entries are opaque payloads (encoded envelopes,
// stored byte for byte), each tagged with the inclusive LSN range it covers.
//
// # Layout
//
// A log is a directory of segment files named after the first LSN they hold,
// as 16 lowercase hex digits. Entries are contiguous across segments, and an
// entry never crosses a segment boundary:
//
//	/data/wal/
//	  0000000000000001.wal   LSNs 1 .. 4096       sealed (synced at rotation)
//	  0000000000001001.wal   LSNs 4097 .. 9000    sealed
//	  0000000000002329.wal   LSNs 9001 .. now     active: appends go here
//
//	segment file
//	+----------------------------+ 0
//	| header (32 bytes)          |  "WSHIPWAL", version, first LSN, CRC32C
//	+----------------------------+ 32
//	| frame: length | crc32c |   |
//	|        first LSN | last LSN|  24-byte frame header
//	|        data (length bytes) |
//	+----------------------------+
//	| frame ...                  |
//	+----------------------------+ end of data
//	| zeros (newest segment only)|  preallocated, overwritten by appends
//	+----------------------------+ end of file
//
// docs/FORMAT.md ("WAL segments") specifies the bytes.
//
// # Durability
//
// Append writes without syncing; Sync fdatasyncs the active segment (and
// fsyncs the directory if a segment was created since). Rotation syncs the
// segment it seals before creating the next one, so at most the newest
// segment can hold unsynced bytes: a crash can only tear the tail of the
// newest segment. A failed write or sync breaks the log for good (ErrBroken):
// after a failed fsync the kernel may have dropped the dirty pages and a
// retry could falsely succeed, so the only safe continuation is to reopen and
// recover from what is on disk.
//
// # Preallocation
//
// As PostgreSQL zero-fills its WAL segments, the active segment is kept
// zero-filled ahead of the write position (Options.Preallocate, 4 MiB by
// default): when an Append would write past the zeros, the file is first
// extended by writing a zeroed chunk, and frames then overwrite blocks that
// are already allocated, so that most fdatasyncs need no size or extent
// update (writing into unwritten extents, as fallocate makes, would not
// help). The size change reaches the disk with the next Sync, once per
// chunk. Sizes reported (Size, SegmentInfos, Stats.BytesWritten) count
// headers and frames only; Stats.Preallocated counts the zeros. Rotation
// cuts the zero tail off the segment it seals before syncing it, so sealed
// segments are exactly their frames and only the newest segment can end in
// zeros.
//
// # Recovery
//
// Open checks every segment in order: the header (magic, version, CRC, first
// LSN matching the file name), LSN continuity between segments, and every
// frame's CRC and LSN continuity. In the newest segment, zeros from the
// first invalid frame to the end of the file are the preallocated tail: the
// clean end of the log, kept as is (appends continue at its start). Two
// kinds of damage are repaired, both only in the newest segment and only if
// no valid frame follows the damage anywhere in the file:
//
//   - a torn tail (a partial frame header or data, a bad CRC, garbage,
//     possibly followed by zeros) is cut off at the last good frame; the cut
//     bytes up to the last non-zero one are kept in
//     "<segment>.<offset>.torn";
//   - a header that was never completely written removes the segment.
//
// Anything else (damage in an older segment, a bad frame followed by valid
// ones, a missing segment in the middle, a well-formed frame with the wrong
// LSNs) fails with a *CorruptionError naming the file and offset, and nothing
// is changed. Recovery reports what it did in RecoveryInfo.
//
// # Reading
//
// A Reader returns entries in LSN order starting from the entry containing
// a given LSN, found through a sparse in-memory index (one point per 4 KiB of
// frames). Next blocks until more is written (or synced, for a durableOnly
// Reader); the writer wakes readers by closing a channel, so there is no
// polling. Readers never take the writer's path: they read below the written
// (or synced) offset, which is immutable.
//
// # Concurrency
//
// A Log has one writer: Append, Sync, Reset, TruncateBefore and Close must
// not run concurrently with each other. Readers, Wait and the getters may run
// concurrently with the writer. The Log starts no goroutines.
package wal
