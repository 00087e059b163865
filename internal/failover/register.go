package failover

import (
	"fmt"

	"github.com/walship/walship/internal/datadir"
)

// The election register: what each log store keeps so that automatic
// failover needs no coordinator beside the log stores. It says which node
// may TRY to become primary; the epoch vote (Acceptor) says who is, so the
// register is needed for liveness only and nothing in it is a fence.
//
//   - a node holds the election at a term when a majority of log stores
//     granted it that term; it renews it at each of them every retry
//     period, and each judges it alive while renewals arrive within the
//     lease on its own clock (no clock is compared across machines);
//   - a campaign is granted only for a newer term, and only while the
//     holder is not alive — or is the candidate — and automatic failover
//     is not paused: so while a majority still hear the primary renew, no
//     replica can gather a majority, whatever it sees of the primary;
//   - while paused, no node but the holder may campaign;
//   - a pause or resume is numbered; a log store adopts a newer one from
//     any request, so one that reached a majority spreads to the others,
//     and any majority a campaign needs holds at least one paused store.

// Register is a log store's persisted election register (the file is
// datadir's).
type Register = datadir.Election

// RegisterOp is what a request does to a Register.
type RegisterOp int

// The operations (walshipv1.ElectOp).
const (
	RegRead RegisterOp = iota + 1
	RegCampaign
	RegRenew
	RegRelease
	RegTakeOver
)

func (o RegisterOp) String() string {
	switch o {
	case RegRead:
		return "read"
	case RegCampaign:
		return "campaign"
	case RegRenew:
		return "renew"
	case RegRelease:
		return "release"
	case RegTakeOver:
		return "take-over"
	}
	return fmt.Sprintf("RegisterOp(%d)", int(o))
}

// RegisterRequest is one request to a Register.
type RegisterRequest struct {
	Op        RegisterOp
	Candidate string
	Term      uint64
	// Create lets a campaign take a register never held.
	Create bool
	// PauseVersion and Paused: the pause state the requester knows of.
	PauseVersion uint64
	Paused       bool
}

// RegisterDecision is what a log store does with a request.
type RegisterDecision struct {
	// Granted: the operation did what it asked (a read: always).
	Granted bool
	// Why the operation was refused.
	Why string
	// Next is the register after the request; Save says it differs from
	// the one before and must be persisted before the answer.
	Next Register
	Save bool
	// Renewed: the holder's lease restarts now; Expired: it ends now.
	Renewed, Expired bool
}

// DecideRegister is the log store's rule for a request on register r,
// given whether it judges r's holder alive (renewed within its lease, on
// its own clock).
func DecideRegister(r Register, alive bool, req RegisterRequest) RegisterDecision {
	d := RegisterDecision{Next: r}
	if req.PauseVersion > r.PauseVersion {
		d.Next.PauseVersion, d.Next.Paused, d.Save = req.PauseVersion, req.Paused, true
	}
	refuse := func(format string, args ...any) RegisterDecision {
		d.Why = fmt.Sprintf(format, args...)
		return d
	}
	grant := func(holder string, term uint64) RegisterDecision {
		if holder != r.Holder || term != r.Term {
			d.Next.Holder, d.Next.Term, d.Save = holder, term, true
		}
		d.Granted, d.Renewed = true, true
		return d
	}
	holds := r.Holder == req.Candidate && r.Term == req.Term && req.Candidate != ""
	switch req.Op {
	case RegRead:
		d.Granted = true
		return d
	case RegCampaign:
		switch {
		case holds:
			// The same campaign asking again (a retry).
			return grant(r.Holder, r.Term)
		case d.Next.Paused && r.Holder != req.Candidate:
			// Paused, failover is; the holder (the primary, restarted)
			// keeps it.
			return refuse("automatic failover is paused (walship ctl failover resume)")
		case r.Term == 0 && r.Holder == "" && !req.Create:
			return refuse("the election was never held: only a new cluster's primary takes it first")
		case req.Term <= r.Term:
			return refuse("term %d is not newer than the register's %d (held by %s)", req.Term, r.Term, r.Holder)
		case alive && r.Holder != req.Candidate:
			return refuse("the holder %s (term %d) is alive: it renewed within its lease", r.Holder, r.Term)
		}
		return grant(req.Candidate, req.Term)
	case RegRenew:
		if !holds {
			return refuse("%s does not hold term %d: %s holds term %d", req.Candidate, req.Term, r.Holder, r.Term)
		}
		return grant(r.Holder, r.Term)
	case RegRelease:
		if !holds {
			return refuse("%s does not hold term %d: %s holds term %d", req.Candidate, req.Term, r.Holder, r.Term)
		}
		d.Granted, d.Expired = true, true
		return d
	case RegTakeOver:
		if holds {
			return grant(r.Holder, r.Term)
		}
		if req.Term <= r.Term {
			return refuse("term %d is not newer than the register's %d (held by %s)", req.Term, r.Term, r.Holder)
		}
		return grant(req.Candidate, req.Term)
	}
	return refuse("unknown operation %v", req.Op)
}
