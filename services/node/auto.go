package node

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/logelect"
)

// Automatic failover (Config.Election; on Kubernetes a Lease, internal/kube):
//
//   - the election decides who may TRY to become primary, the epoch vote
//     (promote.go) who is: an election is no fence, so nothing here is
//     needed for safety, only for liveness;
//   - a primary contends to hold it and takes writes only while it does
//     (primary.Config.Gate), so one that cannot renew stops before the
//     election can pass to another node; one that has not heard from a
//     log store majority for eight retry periods gives it up and does not
//     contend, so that a replica that has may promote;
//   - a replica contends only while it is eligible — the promotion's dry
//     run finds a quorum, it is in the newest epoch, within
//     MaxFailoverLag of the most advanced log, and FailoverHolddown has
//     passed since it saw the epoch change — and a less advanced one
//     waits a little first; holding it, the replica promotes itself, and
//     gives it up if the promotion fails;
//   - a node that opens a new epoch takes the election over (the vote has
//     fenced every other would-be primary), so it follows the epoch, and
//     labels itself (Kubernetes: the walship.io/role and walship.io/reads
//     Pod labels; label.go).

// Election is who may try to become the primary.
type Election interface {
	// Campaign contends until ctx ends or, having held the election, this
	// node loses it; lead runs while it holds it. Only with create may it
	// hold an election never held before (a new cluster's primary does).
	Campaign(ctx context.Context, create bool, lead func(context.Context)) error
	// Held reports whether this node holds the election now.
	Held() bool
	// Renewed returns a channel closed by this node's next acquisition
	// or renewal of the election (after which Held may be true again).
	Renewed() <-chan struct{}
	// TakeOver makes this node the holder, whoever holds it.
	TakeOver(ctx context.Context) error
	// Label tells the world this node's role ("primary", "replica", or ""
	// for none) and whether it serves the clients' reads (reads; nil
	// leaves that as it is).
	Label(ctx context.Context, role string, reads *bool) error
	// Event records something that happened to this node (best effort).
	Event(ctx context.Context, kind, reason, message string)
	// Exists reports whether the election was ever held: a node with an
	// empty data directory that was to bootstrap a new cluster as its
	// primary then joins the one that exists as a replica instead.
	Exists(ctx context.Context) (bool, error)
}

// ElectionViewer is an Election that can say what its quorum sees (the
// log stores' election, internal/logelect): whether the primary still
// renews it there, and whether failover is paused. A replica then does
// not contend while the primary is alive at the log stores, whatever its
// own stream to the primary says, nor while failover is paused.
type ElectionViewer interface {
	Election
	// Read asks the quorum now.
	Read(ctx context.Context) (logelect.View, error)
	// LastView is what the last read, renewal or campaign saw.
	LastView() logelect.View
	// LastOutcome is the last thing the election did on this node.
	LastOutcome() logelect.Outcome
}

// Event kinds (Kubernetes': corev1.EventTypeNormal and Warning).
const (
	eventNormal  = "Normal"
	eventWarning = "Warning"
)

// Defaults of the automatic failover's own settings.
const (
	DefaultMaxFailoverLag    = 100000
	DefaultFailoverHolddown  = 5 * time.Second
	DefaultElectionRetry     = 200 * time.Millisecond
	DefaultSwitchoverTimeout = 20 * time.Second
)

// gate is the primary's Config.Gate under an election.
func (n *Node) gate() error {
	if n.cfg.Election.Held() {
		return nil
	}
	return errors.New("it does not hold the election (the Kubernetes Lease, or the log stores' with --auto-failover) that says who may be primary")
}

// autoFailover runs the election until ctx ends.
func (n *Node) autoFailover(ctx context.Context) {
	el := n.cfg.Election
	for ctx.Err() == nil {
		if prim := n.Primary(); prim != nil && !prim.HasLease() {
			// Cut off from the log stores it cannot take writes: it does
			// not contend, so that a replica that can may.
			backoff.Sleep(ctx, n.retry())
			continue
		}
		if n.Role() != RolePrimary {
			why, behind := n.eligible(ctx)
			if why != "" {
				backoff.Sleep(ctx, n.retry())
				continue
			}
			if behind {
				// A more advanced node may contend: let it go first.
				backoff.Sleep(ctx, 4*n.retry())
			}
		}
		cctx, cancel := context.WithCancel(ctx)
		var leading atomic.Bool // this campaign's
		watched := make(chan struct{})
		go func() { defer close(watched); n.watchCampaign(cctx, cancel, &leading) }()
		create := n.Role() == RolePrimary
		if err := el.Campaign(cctx, create, func(lctx context.Context) { n.lead(lctx, cancel, &leading) }); err != nil {
			n.logger.Error("election", "err", err)
		}
		cancel()
		<-watched
		backoff.Sleep(ctx, n.retry())
	}
}

func (n *Node) retry() time.Duration {
	if n.cfg.ElectionRetry > 0 {
		return n.cfg.ElectionRetry
	}
	return DefaultElectionRetry
}

// watchCampaign ends a replica's campaign (before it leads) once it is no
// longer eligible, and a primary's once it is no longer the primary.
func (n *Node) watchCampaign(ctx context.Context, cancel func(), leading *atomic.Bool) {
	startRole := n.Role()
	for {
		backoff.Sleep(ctx, 4*n.retry())
		if ctx.Err() != nil {
			return
		}
		role := n.Role()
		switch {
		case leading.Load():
			// lead watches from here.
		case startRole == RolePrimary && role != RolePrimary:
			cancel()
			return
		case role == RoleReplica:
			if why, _ := n.eligible(ctx); why != "" && !leading.Load() {
				cancel()
				return
			}
		}
	}
}

// eligible reports whether this replica may contend (else why not), and
// whether another node's log is ahead of its own.
func (n *Node) eligible(ctx context.Context) (why string, behind bool) {
	why, behind = n.eligibility(ctx, n.epochChange())
	n.mu.Lock()
	if why != n.notEligible {
		if why == "" {
			n.logger.Info("this replica may contend for the election")
		} else {
			n.logger.Info("this replica may not contend for the election", "why", why)
		}
		n.notEligible = why
	}
	n.mu.Unlock()
	return why, behind
}

func (n *Node) eligibility(ctx context.Context, changed time.Time) (why string, behind bool) {
	rep := n.Replica()
	switch {
	case rep == nil:
		return "not a replica", false
	case n.promoting.Load():
		return "a promotion is under way", false
	case time.Since(changed) < n.cfg.FailoverHolddown:
		return fmt.Sprintf("the epoch changed less than %v ago (--failover-holddown)", n.cfg.FailoverHolddown), false
	}
	if ev, ok := n.cfg.Election.(ElectionViewer); ok {
		v, err := ev.Read(ctx)
		switch {
		case err != nil:
			return "cannot read the election from the log stores: " + err.Error(), false
		case v.Paused:
			return "automatic failover is paused (walship ctl failover resume)", false
		case v.Alive && v.Holder != n.cfg.ID:
			return fmt.Sprintf("the primary %s is alive: it renews the election at %d of %d log stores", v.Holder, v.AliveAt, v.Stores), false
		}
	}
	if err := leads(n.cfg.ID, rep.EpochRecord()); err != nil {
		return err.Error(), false
	}
	if err := peerlessUnder(n.cfg.ID, n.cfg.Members, rep.EpochRecord()); err != nil {
		return err.Error(), false
	}
	if n.cfg.Join {
		// leads lets a log with no contract pass; a joiner is no member
		// until the contract names it.
		if why := joinState(n.cfg.ID, rep.EpochRecord()); why != "" {
			return "joining (--join): " + why, false
		}
	}
	last, logEpoch, _ := rep.LogPosition()
	e := max(rep.Vote().Epoch, logEpoch)
	if e == 0 {
		// A new cluster whose primary has not opened its first epoch yet:
		// there is nothing to fail over from.
		return "this replica has joined no epoch yet", false
	}
	sctx, cancel := context.WithTimeout(ctx, 10*n.retry())
	defer cancel()
	resp, err := n.promote(sctx, &walshipv1.PromoteRequest{DryRun: true})
	switch {
	case err != nil:
		return "dry run: " + err.Error(), false
	case !resp.GetQuorum():
		return "a promotion would not find its quorum: it needs " + resp.GetNeeded(), false
	}
	if resp.GetEpoch() != e+1 {
		return fmt.Sprintf("a newer epoch than this replica's %d exists", e), false
	}
	if high := resp.GetHighestLsn(); high > last+n.maxLag() {
		return fmt.Sprintf("%d LSNs behind the most advanced log (--max-failover-lag %d)", high-last, n.maxLag()), false
	} else if high > last {
		return "", true
	}
	return "", false
}

// epochChange returns when this node last saw its epoch change (zero if
// it never did: joining the first epoch, or the one it started in, is no
// failover), for the holddown.
func (n *Node) epochChange() time.Time {
	e := n.epoch()
	n.mu.Lock()
	defer n.mu.Unlock()
	if e != n.seenEpoch {
		if n.seenEpoch != 0 {
			n.epochChanged = time.Now()
		}
		n.seenEpoch = e
	}
	return n.epochChanged
}

func (n *Node) maxLag() uint64 {
	if n.cfg.MaxFailoverLag > 0 {
		return n.cfg.MaxFailoverLag
	}
	return DefaultMaxFailoverLag
}

// lead runs while this node holds the election: a replica promotes itself
// (and gives the election up if that fails); a primary holds it until it
// is no longer the primary.
func (n *Node) lead(ctx context.Context, giveUp func(), leading *atomic.Bool) {
	leading.Store(true)
	defer leading.Store(false)
	// A primary whose epoch opened before it held the election (a
	// restart) takes writes from now.
	n.relabelNow()
	el := n.cfg.Election
	if n.Role() != RolePrimary {
		n.logger.Info("holding the election; promoting this replica")
		resp, err := n.promoteAs(ctx, &walshipv1.PromoteRequest{}, true)
		if err != nil {
			n.logger.Warn("automatic promotion refused; giving the election up", "err", err)
			el.Event(context.WithoutCancel(ctx), eventWarning, "PromotionFailed", err.Error())
			giveUp()
			return
		}
		el.Event(context.WithoutCancel(ctx), eventNormal, "Promoting", fmt.Sprintf("promoting to epoch %d: the election's holder, fenced a quorum", resp.GetEpoch()))
		// Run carries the plan out; wait until it did or gave up.
		for ctx.Err() == nil && n.promoting.Load() {
			backoff.Sleep(ctx, n.retry()/5)
		}
		if n.Role() != RolePrimary {
			giveUp()
			return
		}
	}
	var lost time.Time
	for ctx.Err() == nil && n.Role() == RolePrimary {
		backoff.Sleep(ctx, n.retry())
		prim := n.Primary()
		switch {
		case prim == nil || prim.HasLease():
			lost = time.Time{}
		case lost.IsZero():
			lost = time.Now()
		case time.Since(lost) > 8*n.retry():
			// No word from a log store majority: it cannot take writes,
			// and a replica that reaches them could.
			n.logger.Warn("giving the election up: no word from a log store majority", "for", time.Since(lost))
			el.Event(context.WithoutCancel(ctx), eventWarning, "ElectionReleased", "the primary has not heard from a log store majority: it gives the election up for a replica that has")
			giveUp()
			return
		}
	}
	if ctx.Err() == nil {
		// Deposed: let another node have it.
		giveUp()
	}
}

// opened runs once this node has opened a new epoch as primary: the
// election follows the epoch.
func (n *Node) opened(ctx context.Context, epoch uint64) {
	el := n.cfg.Election
	for ctx.Err() == nil && n.Role() == RolePrimary && n.epoch() == epoch {
		if el.Held() {
			// Its own campaign won it (an automatic promotion).
			el.Event(ctx, eventNormal, "Primary", fmt.Sprintf("opened epoch %d as primary", epoch))
			return
		}
		tctx, cancel := context.WithTimeout(ctx, 10*n.retry())
		err := el.TakeOver(tctx)
		cancel()
		if err == nil {
			// It takes writes from now if its epoch is open already.
			n.relabelNow()
			el.Event(ctx, eventNormal, "Primary", fmt.Sprintf("opened epoch %d as primary", epoch))
			return
		}
		n.logger.Warn("could not take the election over", "epoch", epoch, "err", err)
		backoff.Sleep(ctx, n.retry())
	}
}
