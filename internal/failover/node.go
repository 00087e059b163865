package failover

import "fmt"

// NodeState is where a data node's run loop (services/node, Node.Run) is:
// which role runs, or which step of a promotion it is carrying out.
type NodeState int

// The states of a data node.
const (
	// Replica: the replica role runs (it answers fences, and Promote).
	Replica NodeState = iota + 1
	// LeaseWait: a promotion won its quorum; the replica still serves
	// reads, following no one, while the old primary's lease runs out
	// (I7), then stops.
	LeaseWait
	// Opening: the replica stopped; the node checks that it kept no newer
	// promise, cuts and copies its log, and opens as primary.
	Opening
	// Primary: the primary role runs.
	Primary
	// Stopped: the run loop returned.
	Stopped
)

var nodeStateNames = map[NodeState]string{Replica: "replica", LeaseWait: "lease-wait", Opening: "opening", Primary: "primary", Stopped: "stopped"}

func (s NodeState) String() string {
	if n, ok := nodeStateNames[s]; ok {
		return n
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// NodeEvent is what happened to a data node's run loop.
type NodeEvent int

// The events of a data node's run loop.
const (
	// Stop: the node was told to stop (its context ended).
	Stop NodeEvent = iota + 1
	// Planned: a promotion won its quorum (Promote handed Run a plan).
	Planned
	// RoleExited: the running role returned without error and unasked, or
	// with an error that is not a step down.
	RoleExited
	// RoleStoppedForPromotion: the replica role returned after the lease
	// wait, as asked.
	RoleStoppedForPromotion
	// Deposed: the primary stepped down (a newer epoch exists).
	Deposed
	// Superseded: while it waited, the node promised a newer epoch to
	// another candidate; it keeps that promise and does not open (I4).
	Superseded
	// OpenFailed: the catch-up or the start as primary failed.
	OpenFailed
	// Opened: the node started as primary of the new epoch.
	Opened
)

var nodeEventNames = map[NodeEvent]string{Stop: "stop", Planned: "planned", RoleExited: "role-exited",
	RoleStoppedForPromotion: "role-stopped-for-promotion", Deposed: "deposed", Superseded: "superseded",
	OpenFailed: "open-failed", Opened: "opened"}

func (e NodeEvent) String() string {
	if n, ok := nodeEventNames[e]; ok {
		return n
	}
	return fmt.Sprintf("event(%d)", int(e))
}

// Transition is the data node's run loop: the state after e in s. An
// event that cannot happen in s leaves the node where it is, and ok is
// false.
func Transition(s NodeState, e NodeEvent) (next NodeState, ok bool) {
	if e == Stop && s != Stopped {
		return Stopped, true
	}
	switch s {
	case Replica:
		switch e {
		case Planned:
			return LeaseWait, true
		case RoleExited:
			return Stopped, true
		}
	case LeaseWait:
		switch e {
		case RoleStoppedForPromotion:
			return Opening, true
		case RoleExited:
			return Stopped, true
		}
	case Opening:
		switch e {
		case Superseded, OpenFailed:
			// Back to the replica role, following whoever won.
			return Replica, true
		case Opened:
			return Primary, true
		}
	case Primary:
		switch e {
		case Deposed:
			return Replica, true
		case RoleExited:
			return Stopped, true
		}
	}
	return s, false
}
