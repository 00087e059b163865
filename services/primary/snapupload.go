package primary

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/recovery"
	"github.com/walship/walship/internal/snapchunk"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Base snapshots for the log stores (docs/ARCHITECTURE.md, "Log store"):
// after the primary writes a snapshot, one goroutine per log store uploads
// it (LogStoreService.PutSnapshot), in the background, one upload at a
// time per log store, at most every LogStoreSnapshotEvery, each bounded by
// LogStoreSnapshotTimeout and cancelled when the primary stops. A log
// store with snapshots can rebuild any LSN after its oldest one alone —
// a restore, or a replica re-seeded without loading the primary.
//
// The upload is read from the snapshot file just written, pair by pair
// (state.SnapshotScanner): memory stays bounded, and the state's
// copy-on-write tree is not pinned while a slow log store reads. The
// snapshot is at the visible LSN, which can be ahead of what a log store
// has made durable: the log store waits for it (briefly) and refuses a
// snapshot of anything it does not hold, so the primary need not track
// which log store acknowledged what.

// snapOffer is a written snapshot, ready to upload.
type snapOffer struct {
	path   string
	header *walshipv1.SnapshotHeader
	digest string
}

// snapUploads hands the newest snapshot to the log store uploaders.
type snapUploads struct {
	mu     sync.Mutex
	latest *snapOffer
	kicks  []chan struct{}
}

// watch registers an uploader; its channel is signalled on every offer.
func (u *snapUploads) watch() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	ch := make(chan struct{}, 1)
	u.kicks = append(u.kicks, ch)
	if u.latest != nil {
		ch <- struct{}{}
	}
	return ch
}

// unwatch drops an uploader's channel.
func (u *snapUploads) unwatch(ch <-chan struct{}) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.kicks = slices.DeleteFunc(u.kicks, func(k chan struct{}) bool { return k == ch })
}

// offer makes o the snapshot to upload, unless a newer one is.
func (u *snapUploads) offer(o *snapOffer) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.latest != nil && u.latest.header.GetLsn() >= o.header.GetLsn() {
		return
	}
	u.latest = o
	for _, ch := range u.kicks {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (u *snapUploads) newest() *snapOffer {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.latest
}

// offerSnapshot offers the snapshot at lsn (of keys pairs with digest,
// written to path) for upload, and reports whether it did. The header
// says what the log stores check it against: the epochs of the log up to
// lsn and the commit time of the batch that ends there. A snapshot that
// is not at a batch end (the visible LSN can fall between the
// transactions of one batch), whose batch is not in the WAL, or that this
// primary's history does not reach is not offered: the log stores would
// refuse it.
func (s *Server) offerSnapshot(path string, lsn, keys uint64, digest string) bool {
	if len(s.logStores()) == 0 || s.cfg.LogStoreSnapshotEvery < 0 {
		return false
	}
	log := s.logger.With("lsn", lsn, "path", path)
	if s.epochs.EpochOf(lsn) == 0 {
		log.Info("not uploading the snapshot to the log stores: this primary's epoch history does not reach its LSN")
		return false
	}
	r, err := s.wal.NewReader(lsn, true)
	if err != nil {
		log.Info("not uploading the snapshot to the log stores: its batch is not in the WAL", "err", err)
		return false
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := r.Next(ctx) // durable already: the snapshot synced through it
	if err != nil {
		log.Info("not uploading the snapshot to the log stores: cannot read its batch", "err", err)
		return false
	}
	if e.LastLSN != lsn {
		log.Info("not uploading the snapshot to the log stores: it is inside a batch", "batch_first_lsn", e.FirstLSN, "batch_last_lsn", e.LastLSN)
		return false
	}
	var env walshipv1.WalBatch
	if err := envelope.Unmarshal(e.Data, &env); err != nil {
		log.Warn("not uploading the snapshot to the log stores: its batch does not decode", "err", err)
		return false
	}
	s.uploads.offer(&snapOffer{path: path, digest: digest, header: &walshipv1.SnapshotHeader{
		Epoch:              s.epoch,
		Lsn:                lsn,
		Keys:               keys,
		CommitTimeUnixNano: env.CommitTimeUnixNano,
		History:            s.epochs.Cut(lsn).Proto(),
		ClusterId:          s.cluster.ID(),
		CommitLsn:          s.commit.Load(),
	}})
	return true
}

// offerRecovered offers the snapshot recovery started from, so that a
// primary that restarts more often than it snapshots still uploads one,
// and one started on a restored directory, or with log stores that
// replaced the old ones while it was down, gives them a base snapshot at
// once: until they hold one, they (and their archive) can restore the
// cluster, or re-seed a replica, only if their log starts at LSN 1. A
// snapshot whose batch is not in the WAL (a directory restored before
// restores wrote it there, or a WAL cut through it) cannot be offered —
// a log store takes a snapshot only at a batch end it holds — and is
// warned about: the next snapshot is the first the log stores get.
func (s *Server) offerRecovered() {
	lsn := s.snapshotLSN.Load()
	if lsn == 0 {
		return
	}
	path := filepath.Join(recovery.SnapshotDir(s.cfg.DataDir), state.SnapshotName(lsn))
	f, err := s.fs.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return // pruned, or never there: the next snapshot is offered
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return
	}
	sc, err := state.NewSnapshotScanner(f, fi.Size())
	if err != nil || sc.LSN() != lsn {
		return
	}
	// The digest is in the file's trailer; the scanner checks it on the
	// way, so reading the whole file once here confirms it too.
	d, err := sc.Visit(func([]byte, []byte, uint64) error { return nil })
	if err != nil {
		s.logger.Warn("not uploading the recovered snapshot to the log stores", "path", path, "err", err)
		return
	}
	if !s.offerSnapshot(path, lsn, sc.Count(), d.String()) && s.wal.FirstReadableLSN() > lsn {
		s.logger.Warn("the snapshot this primary recovered from cannot be uploaded to the log stores: unless they hold one already, they and their archive cannot restore the cluster or re-seed a replica until this primary's next snapshot (after --snapshot-every-bytes of writes)",
			"lsn", lsn, "wal_first_lsn", s.wal.FirstReadableLSN())
	}
}

// uploadSnapshots feeds one log store with the snapshots offered, until
// ctx ends.
func (s *Server) uploadSnapshots(ctx context.Context, addr string, kick <-chan struct{}) {
	log := s.logger.With("logstore", addr)
	conn, err := s.dialer().Dial(addr, s.dialer().PeerClass(tlsid.ClassLogStore),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(streamMessageBytes), grpc.MaxCallSendMsgSize(streamMessageBytes)))
	if err != nil {
		log.Error("bad log store address", "err", err)
		return
	}
	defer conn.Close()
	client := walshipv1.NewLogStoreServiceClient(conn)
	var (
		done     uint64    // the newest LSN this log store holds a snapshot of
		lastTry  time.Time // when the last upload began
		attempts int       // failed attempts at the newest offer
		tried    uint64    // the LSN they were at
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		}
		for ctx.Err() == nil {
			o := s.uploads.newest()
			if o == nil || o.header.GetLsn() <= done {
				break
			}
			if every := s.cfg.LogStoreSnapshotEvery; !lastTry.IsZero() && time.Since(lastTry) < every {
				if !backoff.Sleep(ctx, every-time.Since(lastTry)) {
					return
				}
				continue // a newer one may have come meanwhile
			}
			if o.header.GetLsn() != tried {
				tried, attempts = o.header.GetLsn(), 0
			}
			lastTry = time.Now()
			result, err := s.uploadSnapshot(ctx, client, o)
			s.metrics.snapshotUploads.WithLabelValues(result).Inc()
			if result != "skipped" {
				s.metrics.snapshotUploadSeconds.Observe(time.Since(lastTry).Seconds())
			}
			switch {
			case err == nil:
				done = o.header.GetLsn()
				if result == "ok" {
					log.Info("uploaded a snapshot to the log store", "lsn", done, "keys", o.header.GetKeys(), "took", time.Since(lastTry))
				}
			case ctx.Err() != nil:
				return
			default:
				attempts++
				log.Warn("snapshot upload to the log store failed", "lsn", o.header.GetLsn(), "attempt", attempts, "err", err)
				if attempts >= maxUploadAttempts || !retriable(err) {
					done = o.header.GetLsn() // leave it; the next snapshot is offered
				} else if !backoff.Sleep(ctx, uploadRetryDelay*time.Duration(attempts)) {
					return
				}
			}
		}
	}
}

// An upload that failed for a reason that may pass (the log store was
// away, or behind) is tried again a few times before it is left for the
// next snapshot.
const (
	maxUploadAttempts = 3
	uploadRetryDelay  = 2 * time.Second
)

func retriable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.FailedPrecondition, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}

// uploadSnapshot streams the offered snapshot to one log store, unless it
// holds it already. Its result is the metric's label: ok, existed (held
// already), skipped (the file is gone: a newer snapshot replaced it) or
// error.
func (s *Server) uploadSnapshot(ctx context.Context, client walshipv1.LogStoreServiceClient, o *snapOffer) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.LogStoreSnapshotTimeout)
	defer cancel()
	lsn := o.header.GetLsn()
	st, err := client.Status(ctx, &walshipv1.LogStoreServiceStatusRequest{})
	if err != nil {
		return "error", fmt.Errorf("status: %w", err)
	}
	for _, si := range st.GetSnapshots() {
		if si.GetLsn() == lsn {
			return "existed", nil
		}
	}
	f, err := s.fs.OpenFile(o.path, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return "skipped", nil
	}
	if err != nil {
		return "error", err
	}
	defer f.Close() // read-only
	fi, err := f.Stat()
	if err != nil {
		return "error", err
	}
	sc, err := state.NewSnapshotScanner(f, fi.Size())
	if err != nil {
		return "error", fmt.Errorf("read %s: %w", o.path, err)
	}
	if sc.LSN() != lsn || sc.Count() != o.header.GetKeys() {
		return "error", fmt.Errorf("%s holds LSN %d with %d pairs, not LSN %d with %d", o.path, sc.LSN(), sc.Count(), lsn, o.header.GetKeys())
	}
	stream, err := client.PutSnapshot(ctx)
	if err != nil {
		return "error", err
	}
	resp, err := sendSnapshot(stream, o.header, sc)
	if err != nil {
		return "error", err
	}
	if got := resp.GetSnapshot().GetStateDigest(); got != o.digest {
		return "error", fmt.Errorf("the log store stored digest %s, the snapshot's is %s", got, o.digest)
	}
	return "ok", nil
}

// sendSnapshot streams the header, the pairs sc reads in chunks of at most
// snapshotChunkBytes, and the trailer, and returns the log store's answer.
// A log store that ends the stream early (it refused, or holds the
// snapshot already) makes a Send fail with io.EOF: its answer is then
// CloseAndRecv's.
func sendSnapshot(stream walshipv1.LogStoreService_PutSnapshotClient, hdr *walshipv1.SnapshotHeader, sc *state.SnapshotScanner) (*walshipv1.PutSnapshotResponse, error) {
	send := func(m *walshipv1.PutSnapshotRequest) error { return stream.Send(m) }
	err := send(&walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Header{Header: hdr}})
	chunks := snapchunk.New(snapshotChunkBytes)
	flush := func() error {
		if ch := chunks.Take(); ch != nil {
			return send(&walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Chunk{Chunk: ch}})
		}
		return nil
	}
	var d state.Digest
	if err == nil {
		// Visit: the chunker copies each pair, so the scanner reads
		// them all into one buffer.
		d, err = sc.Visit(func(k, v []byte, ver uint64) error {
			if chunks.Add(k, v, ver) {
				return flush()
			}
			return nil
		})
	}
	if err == nil {
		err = flush()
	}
	if err == nil {
		err = send(&walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Trailer{Trailer: &walshipv1.SnapshotTrailer{StateDigest: d.String()}}})
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return stream.CloseAndRecv()
}
