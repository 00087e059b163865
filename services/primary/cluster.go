package primary

import (
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/rpcerr"
)

// A primary's cluster id (DataDir/cluster). The cluster's first primary
// makes it; a primary that has none when it starts — a new cluster, or a
// directory older than cluster ids — adopts the one its log stores'
// answers to its fence hold, and makes one if none holds any (or it has
// no log stores). A log store that has an id promises nothing to a fence
// that states none, though: such a primary is deposed if they hold a
// newer epoch (it rejoins as a replica, and adopts its primary's id),
// and otherwise cannot win its epoch. The id is settled after the epoch
// is won and saved before anything of the epoch is written or sent (Run:
// elect, then saveEpoch); every heartbeat, snapshot header and fence
// answer carries it from then on, and a replica, a candidate or a reader
// of another cluster is refused with FAILED_PRECONDITION naming both
// ids, as is a candidate that states none.

// joinCluster settles the primary's cluster id: its own, else the one the
// log stores' answers hold (ids by address), else a new one. Log stores
// that disagree are an error naming them: the primary does not start.
func (s *Server) joinCluster(ids map[string]string) error {
	if s.cluster.ID() != "" {
		return nil
	}
	id, err := datadir.OneClusterID(ids)
	if err != nil {
		return rpcerr.Mismatch("primary %s has no cluster id and its log stores hold several, so it cannot tell which cluster it is of: %v", s.cfg.ID, err)
	}
	how := "adopted from the log stores"
	if id == "" {
		id, how = datadir.NewClusterID(), "made: this primary starts a new cluster"
	}
	if _, err := s.cluster.Adopt(id); err != nil {
		return err
	}
	s.logger.Info("cluster id "+how, "cluster_id", id)
	return nil
}

// refuseOtherCluster refuses a peer that states another cluster than the
// primary's (nil if either id is unknown or they agree), logging and
// counting it: for a replica's hello or a read, which change nothing here
// and may come from a node that has no id yet (rpcerr.CheckCluster). peer
// names it in the refusal ("the replica r1").
func (s *Server) refuseOtherCluster(theirs, peer string) error {
	return s.clusterRefusal(rpcerr.CheckCluster("primary", s.cluster.ID(), peer, theirs), theirs, peer)
}

// requireCluster is refuseOtherCluster for a candidate's fence, which
// deposes this primary: once the primary has an id, an empty one is
// refused too (rpcerr.RequireCluster).
func (s *Server) requireCluster(theirs, peer string) error {
	return s.clusterRefusal(rpcerr.RequireCluster("primary", s.cluster.ID(), peer, theirs), theirs, peer)
}

// clusterRefusal logs and counts err, a refusal of peer for its cluster
// id theirs, if not nil.
func (s *Server) clusterRefusal(err error, theirs, peer string) error {
	if err != nil {
		s.metrics.clusterMismatch.Inc()
		s.logger.Warn("refused a peer of another cluster", "cluster_id", s.cluster.ID(), "peer", peer, "peer_cluster_id", theirs)
	}
	return err
}

// checkClusterID validates a cluster id a request states ("" states
// none): INVALID_ARGUMENT naming field.
func checkClusterID(field, id string) error {
	if id == "" {
		return nil
	}
	if err := datadir.ValidateClusterID(id); err != nil {
		return rpcerr.Invalid(field, "%v", err)
	}
	return nil
}
