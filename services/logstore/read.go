package logstore

import (
	"context"
	"errors"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/wal"
)

// logStoreServer is the LogStoreService.
type logStoreServer struct {
	walshipv1.UnimplementedLogStoreServiceServer
	s *Server
}

// Read streams stored batches from req.FromLsn on. Only durable batches are
// sent; each is unmarshalled and verified again (CRC) before it goes out, so
// a damaged one fails the stream with DATA_LOSS instead of being sent.
func (h *logStoreServer) Read(req *walshipv1.ReadRequest, stream walshipv1.LogStoreService_ReadServer) error {
	s := h.s
	if err := s.openRead(); err != nil {
		return toStatus(err)
	}
	defer s.closeRead()
	// A follower would never end on its own: the graceful stop ends it.
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	defer context.AfterFunc(s.stopReads, cancel)()
	err := s.read(ctx, req, stream)
	if err != nil && ctx.Err() != nil && stream.Context().Err() == nil {
		err = errStopping
	}
	return toStatus(err)
}

func (s *Server) openRead() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return errStopping
	}
	s.active.Add(1)
	s.metrics.readStreams.Inc()
	return nil
}

func (s *Server) closeRead() {
	s.metrics.readStreams.Dec()
	s.active.Done()
}

func (s *Server) read(ctx context.Context, req *walshipv1.ReadRequest, stream walshipv1.LogStoreService_ReadServer) error {
	if err := rpcerr.CheckClusterID("cluster_id", req.GetClusterId()); err != nil {
		return err
	}
	if err := s.guard.Check(req.GetClusterId(), "the request"); err != nil {
		return err
	}
	from, to, follow := req.GetFromLsn(), req.GetToLsn(), req.GetFollow()
	if from != 0 && to != 0 && to < from {
		return refuse(rpcerr.ErrInvalid, "to_lsn: %d is before from_lsn %d", to, from)
	}
	if from == 0 {
		// From the oldest LSN kept; a follower of an empty log store waits
		// for the first batch, whatever its LSN.
		for {
			rounds := s.w.writes.Load()
			if from = s.wal.FirstLSN(); from != 0 {
				break
			}
			if !follow {
				return nil
			}
			if _, err := s.w.writes.Wait(ctx, rounds+1); err != nil {
				return err
			}
		}
		if to != 0 && to < from {
			return refuse(errOutOfRange, "to_lsn: LSN %d is no longer kept (first LSN is %d)", to, from)
		}
	}

	// end is the last LSN a non-following Read sends: what is durable now.
	end := s.wal.DurableLSN()
	if !follow {
		if from > end+1 {
			return refuse(errOutOfRange, "from_lsn: LSN %d is beyond the end of the log store (durable LSN is %d)", from, end)
		}
		if from == end+1 {
			return nil // nothing after it yet
		}
	} else if from > 1 {
		// A follower may ask for LSNs not written yet: wait until the log
		// reaches them (woken by the WAL, no polling).
		if err := s.wal.Wait(ctx, from-1, true); err != nil {
			return err
		}
	}
	// Retention keeps what this stream is still to send.
	p := s.pinLog(from)
	defer s.pins.release(p)
	r, err := s.wal.NewReader(from, true)
	if err != nil {
		return s.readErr(err, from)
	}
	defer r.Close()
	next := from
	for {
		e, err := r.Next(ctx)
		if err != nil {
			return s.readErr(err, next)
		}
		var env walshipv1.WalBatch
		if err := envelope.Unmarshal(e.Data, &env); err != nil {
			return refuse(rpcerr.ErrCorrupt, "stored batch LSNs %d..%d is corrupt: %v", e.FirstLSN, e.LastLSN, err)
		}
		if err := envelope.Verify(&env); err != nil {
			return refuse(rpcerr.ErrCorrupt, "stored batch LSNs %d..%d is corrupt: %v", e.FirstLSN, e.LastLSN, err)
		}
		if env.FirstLsn != e.FirstLSN || env.LastLsn != e.LastLSN {
			return refuse(rpcerr.ErrCorrupt, "stored batch LSNs %d..%d holds an envelope for LSNs %d..%d", e.FirstLSN, e.LastLSN, env.FirstLsn, env.LastLsn)
		}
		if err := stream.Send(&walshipv1.ReadResponse{Batch: &env}); err != nil {
			return err
		}
		s.metrics.readBytes.Add(float64(len(e.Data)))
		next = e.LastLSN + 1
		p.advance(next)
		if (to != 0 && e.LastLSN >= to) || (!follow && e.LastLSN >= end) {
			return nil
		}
	}
}

// readErr words the WAL reader's errors for a Read caller.
func (s *Server) readErr(err error, lsn uint64) error {
	switch {
	case errors.Is(err, wal.ErrCompacted):
		return refuse(errOutOfRange, "LSN %d is no longer kept (first LSN is %d)", lsn, s.wal.FirstLSN())
	case errors.Is(err, wal.ErrFuture):
		return refuse(errOutOfRange, "LSN %d is beyond the end of the log store (last LSN is %d)", lsn, s.wal.LastLSN())
	case errors.Is(err, wal.ErrClosed):
		return errStopping
	}
	return err
}
