package rpcerr

import (
	"log/slog"

	"github.com/walship/walship/internal/datadir"
)

// ClusterGuard is one node's cluster-id check of its peers, the same for
// every service: CheckCluster's and RequireCluster's rules, each refusal
// logged and counted.
type ClusterGuard struct {
	// Role names the refusing node in the refusal ("log store",
	// "replica r1").
	Role string
	// ID is the node's cluster id ("" while it has none).
	ID func() string
	// Refused counts a refusal (the service's cluster-mismatch metric).
	Refused func()
	Logger  *slog.Logger
}

// Check refuses a peer that states another cluster than the node's (nil
// if either id is unknown or they agree): for what changes nothing on the
// node, whose sender may have no id yet (CheckCluster). peer names it in
// the refusal ("the replica r1", "the request").
func (g ClusterGuard) Check(theirs, peer string) error {
	return g.Refusal(CheckCluster(g.Role, g.ID(), peer, theirs), theirs, peer)
}

// Require is Check for what would change the node — a fence, an append,
// a snapshot to install, a primary to follow: once the node has an id,
// an empty one is refused too (RequireCluster).
func (g ClusterGuard) Require(theirs, peer string) error {
	return g.Refusal(RequireCluster(g.Role, g.ID(), peer, theirs), theirs, peer)
}

// Refusal logs and counts err, a refusal of peer for its cluster id
// theirs, if not nil, and returns it.
func (g ClusterGuard) Refusal(err error, theirs, peer string) error {
	if err != nil {
		g.Refused()
		g.Logger.Warn("refused a peer of another cluster", "cluster_id", g.ID(), "peer", peer, "peer_cluster_id", theirs)
	}
	return err
}

// CheckClusterID validates a cluster id a request states ("" states
// none): INVALID_ARGUMENT naming field.
func CheckClusterID(field, id string) error {
	if id == "" {
		return nil
	}
	if err := datadir.ValidateClusterID(id); err != nil {
		return Invalid(field, "%v", err)
	}
	return nil
}
