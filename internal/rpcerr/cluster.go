package rpcerr

import (
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrOtherCluster marks a peer, a request or a data directory of another
// cluster than this node's (FAILED_PRECONDITION).
var ErrOtherCluster = errors.New("cluster id mismatch")

// ClusterMismatchReason is the ErrorInfo reason of OtherCluster's
// refusals; the metadata holds the refusing node's cluster_id and the
// refused peer's peer_cluster_id.
const ClusterMismatchReason = "CLUSTER_MISMATCH"

// OtherCluster is the refusal of a peer of another cluster:
// FAILED_PRECONDITION "cluster id mismatch: this <role> belongs to
// cluster <ours>, <peer> is of cluster <theirs>", with an ErrorInfo that
// lets the refused side recognise it (IsOtherCluster) and read both ids.
// role names the refusing node ("log store", "replica r1"); peer the
// refused side ("the primary", "the candidate c1", "the request").
func OtherCluster(role, ours, peer, theirs string) error {
	st := status.Newf(codes.FailedPrecondition, "%v: this %s belongs to cluster %s, %s is of cluster %s", ErrOtherCluster, role, ours, peer, theirs)
	if theirs == "" {
		st = status.Newf(codes.FailedPrecondition, "%v: this %s belongs to cluster %s, %s states no cluster id", ErrOtherCluster, role, ours, peer)
	}
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ClusterMismatchReason, Domain: "walship.io",
		Metadata: map[string]string{"cluster_id": ours, "peer_cluster_id": theirs}}); err == nil {
		st = d
	}
	return st.Err()
}

// CheckCluster refuses a peer of another cluster: OtherCluster when both
// ids are known and differ, nil otherwise (a node that has no id yet
// adopts the peer's). It is for what changes nothing on this node — a
// read, a replica's hello, a peer's Status — whose sender may have no id
// yet: a new replica, an emptied log store refilling.
func CheckCluster(role, ours, peer, theirs string) error {
	if ours == "" || theirs == "" || ours == theirs {
		return nil
	}
	return OtherCluster(role, ours, peer, theirs)
}

// RequireCluster is CheckCluster for what would change this node — a
// fence, an append, a snapshot to install, a primary to follow: once it
// has an id, the peer must state the same one, and an empty id is refused
// too. Only a node that has none yet takes a peer that states none (a
// cluster's first primary fencing new log stores). Every walship sender
// states its id once it has one, so an empty id at a node that has one is
// a node of another cluster, or of none: a directory made elsewhere, a
// wrong address.
func RequireCluster(role, ours, peer, theirs string) error {
	if ours == "" || ours == theirs {
		return nil
	}
	return OtherCluster(role, ours, peer, theirs)
}

// IsOtherCluster reports whether err is a refusal for another cluster:
// an OtherCluster status (made here or received from a peer, wrapped or
// not) or an error wrapping ErrOtherCluster.
func IsOtherCluster(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrOtherCluster) {
		return true
	}
	_, _, ok := ClusterIDs(err)
	return ok
}

// ClusterIDs reads the ids of an OtherCluster refusal: the refusing
// node's and the refused peer's.
func ClusterIDs(err error) (refuser, refused string, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus || st.Code() != codes.FailedPrecondition {
		return "", "", false
	}
	for _, d := range st.Details() {
		if ei, isInfo := d.(*errdetails.ErrorInfo); isInfo && ei.GetReason() == ClusterMismatchReason {
			return ei.GetMetadata()["cluster_id"], ei.GetMetadata()["peer_cluster_id"], true
		}
	}
	return "", "", false
}

// CheckPeer is this node's own check of what a peer said of itself (its
// Status) — CheckCluster's rule, on the side that reads: a Mismatch
// "<peer> belongs to cluster <theirs>, this <role> to cluster <ours>"
// when both ids are known and differ, nil otherwise. Callers add the
// flag to check, if any ("(check --peers)").
func CheckPeer(role, ours, peer, theirs string) error {
	if ours == "" || theirs == "" || ours == theirs {
		return nil
	}
	return peerMismatch(role, ours, peer, theirs)
}

// RequirePeer is CheckPeer with RequireCluster's rule, for a peer whose
// data this node would take: once this node has an id, a peer that states
// none is refused too (its log is of no cluster's, or an older one's).
func RequirePeer(role, ours, peer, theirs string) error {
	if ours == "" || ours == theirs {
		return nil
	}
	return peerMismatch(role, ours, peer, theirs)
}

func peerMismatch(role, ours, peer, theirs string) error {
	if theirs == "" {
		return Mismatch("%s states no cluster id, this %s belongs to cluster %s", peer, role, ours)
	}
	return Mismatch("%s belongs to cluster %s, this %s to cluster %s", peer, theirs, role, ours)
}

// Mismatch is an error of this node's own finding — not a peer's
// refusal — that a peer belongs to another cluster: it wraps
// ErrOtherCluster (FAILED_PRECONDITION at the edge) and names both ids.
func Mismatch(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrOtherCluster, fmt.Sprintf(format, args...))
}
