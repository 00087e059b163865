// Package state is walship's materialised key-value state: the ordered map a
// replica (or the primary) builds by applying WAL batches, plus the pieces
// built on it.
//
//   - [Store] applies [codec.Batch]es atomically (one write lock per
//     batch) and serves point reads under a read lock. A [View] taken with
//     [Store.Snapshot] is a copy-on-write clone of its B-tree: O(1) to take,
//     a consistent point-in-time image never disturbed by later writes, and
//     read without any lock. Scans run on Views.
//   - [Digest] is an order-independent hash of the live content, maintained
//     incrementally so it can be compared between primary and replicas at
//     any LSN for free.
//   - [Overlay] puts the primary's pending (sequenced but not yet applied)
//     writes on top of a Store, so that [Compare]s of later transactions see
//     them while readers still see only the Store.
//   - [Compare] evaluates etcd-style transaction guards against any [Reader].
//   - [WriteSnapshot] and [ReadSnapshot] move a View to and from bytes, and
//     [SaveSnapshot] and [LoadLatestSnapshot] keep snapshots in a directory.
//     [SnapshotEncoder] and [SnapshotScanner] write and read the same
//     format one pair at a time, in bounded memory, for snapshots that
//     are streamed rather than held (a log store's base snapshots).
//
// # Versions
//
// Every live key has a version: the commit LSN of the transaction that last
// wrote it, that is the LSN of the [codec.OpCommit] record ending that
// transaction (etcd's mod_revision), not the LSN of the put record. All keys
// written by one transaction share its commit LSN, and writing a key twice
// in one transaction gives it the commit LSN once. The primary returns the
// commit LSN to the writer, so a writer can use it directly as the operand
// of a [TargetVersion] [Compare]. An [Overlay] gives a pending write the
// same version the Store gives it once applied. A version is never 0 (0 is
// what an absent key compares as) and never exceeds the applied LSN.
//
// # Snapshot format
//
// A snapshot is little-endian and has three parts (docs/FORMAT.md, "State
// snapshots", is the full specification):
//
//	header  (32 bytes) magic "WSHPSNAP", format version u32 = 1, flags u32 = 0,
//	                   applied LSN u64, entry count u64
//	entries (count×)   key length u32, key, version u64, value length u32, value
//	                   in strictly ascending key order
//	trailer (36 bytes) digest (32 bytes), CRC-32C (Castagnoli) u32 of every
//	                   preceding byte
//
// The encoding is canonical: a store has exactly one encoding, so a snapshot
// that reads back without error re-encodes to identical bytes.
package state
