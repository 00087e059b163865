// Package logstore is walship's log store: it keeps the WAL a primary ships
// durably, so that a replica that fell behind the primary's retention can
// catch up from it (the second rung of the catch-up ladder).
//
// # Append
//
// A primary opens one bidirectional Append stream and sends batches (and
// heartbeats while idle). Each stream has one receiving goroutine, which
// checks each request on its own (envelope shape, CRC-32C of the payload,
// payload LSNs matching the envelope) and queues it, and one sending
// goroutine (the handler), which sends acknowledgements. A single writer
// goroutine owns the WAL. Each round it takes every queued request of every
// stream, in arrival order, and applies the log's rules:
//
//   - the first message of a stream must carry a heartbeat declaring the
//     sender's epoch (INVALID_ARGUMENT otherwise): every rule below is
//     about it, and a stream that declared none would pass them as "no
//     epoch". A cut (truncate_after_lsn) must come from an epoch newer
//     than every entry it removes: a primary cuts only a tail of epochs
//     its history lacks;
//   - a batch that is exactly a stored one (same LSN range, same bytes) is
//     a retransmission: acknowledged without being stored twice, whatever
//     its epoch (a new primary catching the log store up ships the batches
//     of earlier epochs byte for byte: the envelope carries the epoch of
//     the primary that wrote it);
//   - otherwise an epoch below the highest seen fails the stream with
//     FAILED_PRECONDITION ("stale epoch E, log store is at epoch H"): epochs
//     only grow along the log, so such a batch can only come from a deposed
//     primary. A heartbeat with a stale epoch (when it states one) fails the
//     same way, so an idle deposed primary learns it is fenced; a heartbeat
//     never raises the epoch, since its sender may still have earlier
//     epochs' batches to ship;
//   - an empty log store accepts any first LSN (a primary may start
//     shipping mid-log); otherwise a batch must start at the last LSN + 1:
//     a gap fails with INVALID_ARGUMENT, an overlap with OUT_OF_RANGE, both
//     naming the LSNs;
//   - a batch of a higher epoch that is accepted raises the epoch, which is
//     written to DataDir/epoch (temporary file, fsync, rename, directory
//     fsync) before anything of the round is acknowledged.
//
// The accepted batches are written with one WAL Append, fsynced once, and
// then each stream that sent something in the round gets one cumulative
// AppendResponse{durable_lsn, epoch} (acks are coalesced: a slow stream only
// ever sees the newest). A heartbeat is answered the same way, which is how
// a primary learns the log store's position after it connects. The bytes
// stored are envelope.Marshal of the batch: deterministic, so identical to
// what the primary stored in its own WAL.
//
// A bad CRC fails the stream with DATA_LOSS naming the LSNs; a malformed
// envelope (epoch or first_lsn 0, last_lsn before first_lsn, prev_lsn not
// first_lsn-1, unknown codec, empty payload, payload not holding the
// envelope's LSNs) with INVALID_ARGUMENT naming the field. Nothing of a
// refused batch is stored; batches the same stream sent before it in the
// round are stored and acknowledged before the error ends the stream.
//
// A failed WAL write or fsync (or epoch file fsync) is fatal: the log's
// state on disk is unknown and retrying an fsync can report success for lost
// data. Every stream fails with UNAVAILABLE, the log store stops and Run
// returns the error. Each stream may have at most twice the maximum message
// size queued, so a primary faster than the disk is slowed down by flow
// control rather than growing memory.
//
// # Read
//
// Read streams stored batches, byte for byte, from the batch containing
// from_lsn. from_lsn 0 means "from the oldest LSN kept". An LSN older than
// the oldest kept fails with OUT_OF_RANGE ("LSN X is no longer kept (first
// LSN is Y)"), the signal for a replica to fall back to a snapshot; so does
// a from_lsn beyond the durable end + 1 without follow (from_lsn = end + 1
// returns an empty stream). With follow the stream continues with new
// batches as they become durable, woken by the WAL (no polling); a follower
// may ask for an LSN not written yet and waits for it. to_lsn stops the
// stream after the batch containing it; to_lsn below from_lsn is
// INVALID_ARGUMENT. Only durable batches are sent, and each is unmarshalled
// and verified (CRC) again before it is sent: a damaged one fails the stream
// with DATA_LOSS and is never sent.
//
// # Cluster identity
//
// The log store belongs to one cluster (DataDir/cluster, internal/datadir).
// One with no cluster id yet adopts the id of the first fence it grants or
// of the first primary's heartbeat it accepts, saving it before it acts
// on anything that came with it. From then on a Fence, an Append
// heartbeat, a snapshot upload or a Read that states another cluster's id
// is refused with FAILED_PRECONDITION ("cluster id mismatch: this log
// store belongs to cluster X, the primary p is of cluster Y"), before
// anything is changed on disk, and counted (walship_cluster_mismatch_total).
// So is an Append heartbeat, a snapshot upload or a fence it would grant
// that states no id ("... the candidate c states no cluster id"): every
// walship sender states its id once it has one, and one that states none
// could be another cluster's node. A fence it would not grant is answered
// as ever (a primary restarting from a directory older than cluster ids
// learns it was deposed), and a Read that states none is served: a new
// replica and an emptied log store refilling have none yet.
//
// # Refill
//
// A log store with peers (Config.Peers, `--peers`: the cluster's other log
// stores; it may be listed itself, and knows itself by the instance token
// its Status answers carry in a header) refills what it lacks from them
// (refill.go):
//
//   - when it starts empty: before it takes any Append stream, so that its
//     log does not begin at the primary's oldest batch without the history
//     its peers keep. While no peer answers it waits (Append refused);
//     peers that answer but hold nothing (a new cluster) end the wait;
//   - when its primary's batch starts after its last LSN (a gap: it was
//     away past the primary's WAL retention): that Append stream is
//     refused and the refill begins.
//
// While it refills, Status says refilling, and Append is refused with
// UNAVAILABLE ("refilling from peers ...") — streams open when it began
// are ended — so that the primary retries later; Fence is answered as
// always. The refiller asks every peer's Status and copies from one whose
// log ends in an epoch at least the one this log store promised (an older
// one may end in a deposed primary's tail that the promised epoch cut),
// whose epoch history holds this log store's whole log, and that holds the
// LSN after its end: the newest epoch first, then (for an empty log
// store) the one keeping the most history, then the furthest end. It Reads
// from there to that peer's durable LSN and hands each batch, checked
// (shape, CRC) as a primary's, to the writer, which admits it by the
// Append rules — continuity, exact retransmissions, epochs never going
// down along the log — and also requires it to be of the epoch the peer's
// history says wrote its first LSN, and stops the refill if a fence
// promised an epoch newer than the peer's log meanwhile. A copied batch of
// an epoch newer than the promise raises the promise to it (that epoch's
// primary has opened, so its predecessors are deposed). An empty log
// store takes, with its first batch, the peer's history up to it: the
// epochs before its first LSN too, which the peer keeps after its
// retention cut their batches. The refill ends when it has copied through
// the peer's end, or when no peer can supply what is missing; a copy that
// fails is retried with backoff (at most three times in a row once the log
// store holds something: the primary's next stream asks again).
//
// With an archive (Config.Archive), what no peer can supply — their
// retention cut it, no peer answers, none fits — is copied from the
// archive through the same writer and checks (refill_archive.go): the
// chunks of the archive's lineage, which must hold this log store's whole
// log and end in an epoch at least its promise; then the peers are asked
// again for what follows. An empty log store starts at the newest point
// (LSN 1 or a base snapshot of the lineage) from which the archive's
// chunks reach furthest, and takes the lineage's epochs before it as its
// history. A log store with an archive and no peers refills a gap from the
// archive alone; one that starts empty without peers does not refill.
//
// # Base snapshots
//
// PutSnapshot stores a base snapshot of the state from a primary, so that
// the log stores alone can rebuild any LSN from the snapshot's on (a
// restore, a replica re-seeded without loading the primary). The stream
// is a header, chunks of pairs in ascending key order and a trailer with
// the state digest. The header's LSN must be a batch end the log store
// holds durably (it waits up to 10 s for it: a primary snapshots at its
// visible LSN, which may still be on its way) and the header's epoch
// history must give that LSN the stored batch's epoch (the same entry,
// so the same state); a header of an epoch the vote has fenced is
// refused. Refusals are FAILED_PRECONDITION; a malformed stream (no header
// first, pairs out of order, a wrong count, no trailer) INVALID_ARGUMENT
// naming the part; a digest that differs from the pairs' DATA_LOSS.
//
// The pairs go to disk as they arrive (one chunk in memory at a time)
// through a state.SnapshotEncoder, into DataDir/snapshots/
// base-<LSN>.snap.tmp, which is fsynced and renamed into place before the
// directory is fsynced and the snapshot acknowledged (docs/FORMAT.md,
// "Base snapshots in a log store"). An upload of an LSN already stored is
// answered with what is stored. One upload is stored at a time.
//
// GetSnapshot streams the newest snapshot at or before at_most_lsn
// (NOT_FOUND if none is stored, OUT_OF_RANGE if all are newer): a header
// carrying what a restore needs (LSN, the epoch and commit time of the
// batch ending there, the pair count, the epoch history up to it), the
// chunks, and a trailer that is only sent once the file's CRC and digest
// are checked — a damaged file fails the stream with DATA_LOSS instead.
//
// At start, leftover temporary files (interrupted uploads) are removed and
// logged; a file whose meta or header is damaged is not served but left in
// place (Verify reports it); a snapshot past the end of the log, or of
// another epoch than the log at its LSN, is removed. When a primary cuts a
// diverged tail, the snapshots above the cut are removed with it.
//
// # Retention
//
// A background goroutine, woken after every round that wrote, after a
// snapshot is stored and by a ticker when an age limit is set, removes
// whole sealed segments, oldest first, while the log is bigger than
// RetentionBytes or while the segment's newest batch was committed more
// than RetentionAge ago. A segment's age is the commit_time_unix_nano of
// its newest batch, that is the primary's clock: the same on every copy of
// the log and independent of file times; a skewed primary clock skews
// retention by as much. The active segment and anything not durable are
// never removed.
//
// With base snapshots stored, what is left stays restorable: a restore
// starts from a snapshot at LSN s and replays the log from s+1, so the log
// is cut at most to just after the newest snapshot (whole segments: it may
// start a little before), and the snapshots older than the one the log
// then starts from — which it can no longer continue — are removed; the
// newest is always kept. What the limits would remove but this keeps is
// walship_logstore_retention_held_bytes. With no snapshot at all the
// limits apply as they are.
//
// Readers pin what they still need: a Read stream the LSN it sends next, a
// GetSnapshot stream its snapshot and the log after it, Verify its
// position. Retention removes nothing at or after a pin, until the stream
// ends (a restore opens its Read from the snapshot's LSN + 1 before its
// GetSnapshot ends, and keeps both).
//
// # Verify
//
// Verify reads the whole stored log, from its first LSN to the durable LSN
// when it starts, through ordinary WAL readers beside the writer (appends
// go on; its position is pinned against retention), and every snapshot
// file whole. It checks each frame's CRC (a damaged frame ends what can
// be read of its segment: the rest is reported unchecked and the next
// segment read), that each envelope decodes and its payload CRC matches,
// that its LSNs are its frame's and follow the previous batch's, that
// epochs never go down and are the history's for their LSNs, and that
// each snapshot file's meta, pairs, CRC and digest are intact and its
// epoch is the log's at its LSN. The same problem in consecutive batches
// is reported once for the stretch. It reports the restorable range: from
// a starting point (an intact snapshot, or LSN 0 when the log starts at
// LSN 1) to the end of the unbroken run of intact batches after it — the
// one that reaches furthest, from its oldest start.
//
// Recovery already refuses to open a log with a damaged frame anywhere
// but at the newest segment's tail (cut as torn); Verify finds damage
// that happened since the log store started, and damage inside intact
// frames (a payload CRC, an epoch, LSNs) that recovery does not look at.
//
// # Goroutines and locks
//
// Run starts four goroutines besides gRPC's, each owning one job and the
// state of its own type: the writer (writerState, append.go) owns the
// WAL's append side, the epoch files and the queue's consumer end;
// retention (retentionState, retention.go) removes old segments and
// snapshots; the refiller (refillState, refill.go) copies what the log
// store lacks from its peers through the writer; the archiver (archiver,
// archive.go) uploads. Each Append stream has a receiving goroutine and
// a sending one (appendStream); Read, GetSnapshot, PutSnapshot and Verify
// handlers run on gRPC's.
//
// Lock order — a goroutine holding one of these takes only those after it:
//
//	ret.mu → pins.mu → walMu → mu → appendStream.mu
//
// ret.mu makes a retention pass exclusive; pins.mu keeps readers from
// pinning what the pass cuts; walMu serialises the WAL's single-writer
// operations (a writer round or fence, retention's cut); mu guards the
// streams, the lifecycle flags and the writer's queue (the writer takes
// it under walMu to end streams: beginRefill, a fence); a stream's mu
// its acks. snaps.mu and archiver.mu are leaves: taken under any of the
// above, nothing is taken under them. putSem (one PutSnapshot at a time)
// is held for a whole upload and taken before any mutex.
//
// # Lifecycle
//
// New recovers the WAL (a torn tail is cut) and the epoch, and listens;
// health is NOT_SERVING until Run starts. On ctx cancellation Run turns
// health NOT_SERVING, refuses new streams, ends Read streams with
// UNAVAILABLE, lets Append streams have their in-flight batches fsynced and
// acknowledged (then ends them with UNAVAILABLE "log store is stopping"),
// closes the WAL and unregisters its metrics.
package logstore
