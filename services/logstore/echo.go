package logstore

import (
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/failover"
)

// echoState is what answering heartbeats at once (echoNow) shares with the
// writer's fences.
//
// A primary's lease lasts while a log store majority echoes its heartbeats
// (Failover invariant 7). Queued behind the stream's batches, a heartbeat
// would be echoed only after the writer's round that holds it — its
// writes and its fsync, up to a stream budget of batches ahead of it — and
// a bulk load on a slow disk would depose a healthy primary. So a
// heartbeat that changes nothing (failover.State.EchoNow) is echoed as
// soon as it is received, and still queued for the writer.
//
// A candidate waits out the old primary's lease from the contact its
// promisers report (handleFence's since_primary_contact), so that contact
// must cover every early echo: echoNow records its time (at) before it
// reads the promise, and a fence reads at only after it published the new
// promise. Both are sequentially consistent atomics, so an echo that saw
// the older promise is seen by the fence (the candidate waits longer), and
// one that did not is not sent.
type echoState struct {
	base time.Time // at is in nanoseconds since base (monotonic)
	at   atomic.Int64
}

// echoNow answers hb, just received on st and queued for the writer, at
// once if the failover core allows it (failover.State.EchoNow).
func (s *Server) echoNow(st *appendStream, hb *walshipv1.Heartbeat) {
	now := time.Since(s.echo.base).Nanoseconds()
	for {
		// The newest time only: concurrent streams may race.
		old := s.echo.at.Load()
		if old >= now || s.echo.at.CompareAndSwap(old, now) {
			break
		}
	}
	m := failover.Heartbeat{Epoch: hb.GetEpoch(), Primary: hb.GetPrimaryId(), Addr: hb.GetPrimaryAddr(), Cluster: hb.GetClusterId()}
	if !s.acceptor().EchoNow(m, st.admitted.Load()) || st.failed() || st.wasRefused() {
		return
	}
	st.echo(s.epoch.Load(), hb.GetTimeUnixNano())
}

// lastContact is when the log store last took a primary's word: the
// writer's last admitted request or the last heartbeat echoed at once
// (or about to be: see echoState), whichever is newer. Writer-only (walMu
// held).
func (s *Server) lastContact() time.Time {
	last := s.w.lastContact
	if at := s.echo.at.Load(); at != 0 {
		if e := s.echo.base.Add(time.Duration(at)); e.After(last) {
			last = e
		}
	}
	return last
}
