package replica

import (
	"fmt"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/rpcerr"
)

// A replica's cluster id (DataDir/cluster). A replica with none adopts the
// id of the first primary it accepts — from the heartbeat that opens every
// stream — or of the primary's snapshot it re-seeds from, or of a
// candidate whose fence it grants, saving it before it acts on anything
// that came with it. From then on a primary, a snapshot, a candidate or a
// reader that states another id is refused (FAILED_PRECONDITION naming
// both, counted in walship_cluster_mismatch_total): the replica neither
// promises it anything nor follows it, and nothing changes on disk. So
// is a primary, a snapshot, a log store to catch up from or a candidate
// it would grant that states no id (guard.Require); a reader that states
// none is served.

// checkPeerCluster checks a cluster id a peer this replica takes from (the
// primary's stream or snapshot, a log store) states: a malformed one is a
// refusal of the message, another cluster's (or none, once the replica has
// an id) guard.Require's.
func (s *Server) checkPeerCluster(theirs, field, peer string) error {
	if err := rpcerr.CheckClusterID(field, theirs); err != nil {
		return &refusal{reason: reasonDecode, err: err}
	}
	return s.guard.Require(theirs, peer)
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

// primaryPeer names the primary that sent hb, for a refusal.
func primaryPeer(hb *walshipv1.Heartbeat) string {
	if id := hb.GetPrimaryId(); id != "" {
		return "the primary " + id
	}
	return "the primary"
}

// ClusterID is the replica's cluster id ("" while it has none).
func (s *Server) ClusterID() string { return s.cluster.ID() }
