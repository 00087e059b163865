package replica

import (
	"fmt"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/rpcerr"
)

// A replica's cluster id (DataDir/cluster). A replica with none adopts the
// id of the first primary it accepts — from the heartbeat that opens every
// stream — or of the primary's snapshot it re-seeds from, or of a
// candidate whose fence it grants, saving it before it acts on anything
// that came with it. From then on a primary, a snapshot, a candidate or a
// reader that states another id is refused (FAILED_PRECONDITION naming
// both, counted in walship_cluster_mismatch_total): the replica neither
// promises it anything nor follows it, and nothing changes on disk.

// refuseOtherCluster refuses a peer that states another cluster than the
// replica's (nil if either id is unknown or they agree), logging and
// counting it. peer names it ("the primary p1").
func (s *Server) refuseOtherCluster(theirs, peer string) error {
	err := rpcerr.CheckCluster("replica "+s.cfg.ID, s.cluster.ID(), peer, theirs)
	if err != nil {
		s.metrics.clusterMismatch.Inc()
		s.logger.Warn("refused a peer of another cluster", "cluster_id", s.cluster.ID(), "peer", peer, "peer_cluster_id", theirs)
	}
	return err
}

// checkPeerCluster checks a cluster id a peer this replica follows (the
// primary's stream or snapshot) states: a malformed one is a refusal of
// the message, another cluster's refuseOtherCluster's.
func (s *Server) checkPeerCluster(theirs, field, peer string) error {
	if err := checkClusterID(field, theirs); err != nil {
		return &refusal{reason: reasonDecode, err: err}
	}
	return s.refuseOtherCluster(theirs, peer)
}

// adoptCluster makes id the replica's cluster id if it has none (and id
// is set): saved durably before the caller acts on what came with it. A
// failure to save is fatal to the follower.
func (s *Server) adoptCluster(id, from string) error {
	if id == "" || s.cluster.ID() != "" {
		return nil
	}
	adopted, err := s.cluster.Adopt(id)
	if err != nil {
		return fmt.Errorf("%w: save the cluster id: %w", errFatal, err)
	}
	if adopted {
		s.logger.Info("joined a cluster", "cluster_id", id, "from", from)
	}
	return nil
}

// checkClusterID validates a cluster id a message states ("" states
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

// primaryPeer names the primary that sent hb, for a refusal.
func primaryPeer(hb *walshipv1.Heartbeat) string {
	if id := hb.GetPrimaryId(); id != "" {
		return "the primary " + id
	}
	return "the primary"
}

// ClusterID is the replica's cluster id ("" while it has none).
func (s *Server) ClusterID() string { return s.cluster.ID() }
