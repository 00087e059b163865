package primary

import (
	"context"
)

// The commit watermark is the highest LSN the cluster's contract has
// acknowledged: the primary has made it durable, k of its members have
// reached it at the contract's stage, and, if the contract asks, a log
// store majority has made it durable. A promotion's quorum meets every set
// that could have acknowledged it, so no failover takes back an LSN at or
// below the watermark; above it, one can (ARCHITECTURE, Known limits).
// The primary sends it on every replication message, and replicas serve
// plain reads and watches at most up to it; watches on the primary too.
//
// It advances only once the epoch is open: until the epoch record meets
// the contract, entries of an older epoch this primary holds may still be
// cut by another promotion, whatever acks they gathered then.

// commitLSN computes the commit watermark from the current positions (0
// while the epoch is not open).
func (s *Server) commitLSN() uint64 {
	if !s.opened.Load() {
		return 0
	}
	w := s.wal.DurableLSN()
	c := s.commitContract
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	if k := int(c.GetSyncReplicas()); k > 0 {
		w = min(w, s.peers.replicaQuorumLocked(waitClass{level: c.GetSyncLevel(), k: k}))
	}
	switch {
	case c.GetLogstoreSync():
		w = min(w, s.peers.logStoreQuorumLocked())
	case c.GetSyncReplicas() == 0 && s.peers.quorum > 0:
		// A contract of the primary's fsync alone: a promotion needs no
		// member (failover.PromotionNeed is 0), only a log store
		// majority, so only what a majority of them holds survives one.
		w = min(w, s.peers.logStoreQuorumLocked())
	}
	return w
}

// trackCommit advances s.commit whenever a position it depends on moves
// (the WAL's durable LSN, a replica's or log store's ack, the epoch's
// opening), until ctx ends.
func (s *Server) trackCommit(ctx context.Context) {
	for {
		walChanged := s.wal.Changed()
		moved := s.peers.movedCh()
		var opening <-chan struct{}
		if !s.opened.Load() {
			opening = s.openedCh
		}
		s.commit.Advance(s.commitLSN())
		commit := s.commit.Load()
		// Watches read what is both acknowledged and applied here. While
		// the visible LSN is at or past the watermark (always under
		// async durability: commits show before their fsync) only the
		// watermark moves the bound, so a commit made visible wakes
		// nothing here.
		var visChanged <-chan struct{}
		visible := s.pipe.visible.Load()
		if visible < commit {
			visible, visChanged = s.pipe.visible.Changed()
		}
		s.pipe.feed.Bound.Advance(min(commit, visible))
		select {
		case <-ctx.Done():
			return
		case <-walChanged:
		case <-moved:
		case <-visChanged:
		case <-opening:
		}
	}
}

// markOpened opens the epoch for reads and writes, and the commit
// watermark with it.
func (s *Server) markOpened() {
	if !s.opened.Swap(true) {
		close(s.openedCh)
	}
}

// CommitLSN returns the primary's commit watermark.
func (s *Server) CommitLSN() uint64 { return s.commit.Load() }
