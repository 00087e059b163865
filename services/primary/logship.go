package primary

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/wal"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// shipLogStore keeps one log store fed: it dials, asks where the log store
// is, streams durable WAL batches from there, and records the log store's
// cumulative durable acks. It reconnects with backoff until ctx ends.
func (s *Server) shipLogStore(ctx context.Context, addr string) {
	log := s.logger.With("logstore", addr)
	conn, err := grpc.NewClient(addr, serve.DialOptions(
		// Find a dead connection (a partition sends no FIN) within ~15s.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(streamMessageBytes), grpc.MaxCallSendMsgSize(streamMessageBytes)))...)
	if err != nil {
		log.Error("bad log store address", "err", err)
		return
	}
	defer conn.Close()
	client := walshipv1.NewLogStoreServiceClient(conn)
	var bo backoff.Backoff
	for ctx.Err() == nil {
		began := time.Now()
		err := s.shipOnce(ctx, client, addr)
		if time.Since(began) > 10*time.Second {
			bo.Reset() // it was healthy for a while: retry quickly
		}
		s.peers.updateLogStore(addr, func(l *logstorePos) { l.connected = false })
		if ctx.Err() != nil {
			return
		}
		log.Warn("log store stream ended; reconnecting", "err", err)
		if !bo.Wait(ctx) {
			return
		}
	}
}

func (s *Server) shipOnce(ctx context.Context, client walshipv1.LogStoreServiceClient, addr string) error {
	st, err := client.Status(ctx, &walshipv1.LogStoreServiceStatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if st.Epoch > s.epoch {
		return fmt.Errorf("log store has seen epoch %d, newer than ours (%d): this primary is deposed", st.Epoch, s.epoch)
	}
	from, durable := st.DurableLsn+1, st.DurableLsn
	if st.FirstLsn == 0 {
		// An empty log store starts at the oldest batch we still have. It
		// may report a durable LSN even so (a WAL anchored by a segment
		// header written before a crash); holding nothing, it vouches for
		// nothing.
		from, durable = max(s.wal.FirstLSN(), 1), 0
	}
	rd, err := s.wal.NewReader(from, true)
	if err != nil {
		if errors.Is(err, wal.ErrCompacted) {
			return fmt.Errorf("log store is at LSN %d but the primary's WAL starts at %d: the log store has a gap it cannot fill from here: %w", st.DurableLsn, s.wal.FirstLSN(), err)
		}
		return fmt.Errorf("read wal from %d: %w", from, err)
	}
	defer rd.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Append(sctx)
	if err != nil {
		return fmt.Errorf("append: %w", err)
	}
	s.peers.updateLogStore(addr, func(l *logstorePos) { l.connected, l.durable = true, max(l.durable, durable) })
	s.logger.Info("shipping to log store", "logstore", addr, "from_lsn", from)
	recvDone := make(chan error, 1)
	go func() {
		for {
			ack, err := stream.Recv()
			if err != nil {
				recvDone <- err
				return
			}
			s.peers.updateLogStore(addr, func(l *logstorePos) {
				l.durable = max(l.durable, ack.DurableLsn)
				l.lastAck = time.Now()
			})
		}
	}()
	sendErr := func() error {
		want := from // first LSN of the entry to send next
		for {
			var e wal.Entry
			var err error
			if s.wal.DurableLSN() >= want {
				e, err = rd.Next(sctx) // available: no timer needed
			} else {
				nctx, ncancel := context.WithTimeout(sctx, s.cfg.HeartbeatInterval)
				e, err = rd.Next(nctx)
				ncancel()
			}
			if err == nil {
				want = e.LastLSN + 1
			}
			switch {
			case errors.Is(err, context.DeadlineExceeded) && sctx.Err() == nil:
				err = stream.Send(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{
					Epoch: s.epoch, LastLsn: s.wal.DurableLSN(), TimeUnixNano: time.Now().UnixNano(), ReplyRequested: true}})
			case err != nil:
				return err
			default:
				err = stream.Send(withRawBatch(&walshipv1.AppendRequest{}, e.Data))
				// A commit waits (or is about to wait) for the log stores:
				// ask for the round now, not after the log store's delay.
				if err == nil && (e.LastLSN <= s.lsWanted.Load() || s.peers.lsWaiting.Load() > 0) {
					err = stream.Send(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{
						Epoch: s.epoch, LastLsn: s.wal.DurableLSN(), TimeUnixNano: time.Now().UnixNano(), ReplyRequested: true}})
				}
			}
			if err != nil {
				return err
			}
		}
	}()
	cancel()
	rerr := <-recvDone
	if errors.Is(sendErr, io.EOF) || errors.Is(sendErr, context.Canceled) {
		// The receive side holds the log store's reason.
		return rerr
	}
	return sendErr
}

// streamMessageBytes bounds a replication or log store stream message. It
// carries one WAL entry: a batch of at most MaxBatchBytes, or one larger
// transaction, which the request limit bounds; Config.Validate keeps both
// to half of it (maxBatchLimit, maxValueLimit). A log store's default
// message limit (logstore.DefaultMaxMessageBytes) is the same.
const streamMessageBytes = 64 << 20
