package node

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/walship/walship/services/primary"
)

// Labels (Config.Election's Label; on Kubernetes two labels of the node's
// own Pod, internal/kube, which the client Services select on):
//
//   - the role: "primary" while the node takes writes (walship-rw),
//     "replica" as a replica, none as a primary that does not take writes;
//   - reads: set while the node serves walship-ro's reads — as a replica,
//     and for readsLabelGrace after it starts taking writes as a primary
//     (which serves reads too), then removed; none as a primary that does
//     not take writes.
//
// Why two: a label change updates the EndpointSlice of every Service
// whose selection it changes, one slice at a time, and kube-proxy applies
// a change at most once per minSyncPeriod (1 s by default, no burst). Had
// walship-ro selected role=replica, a hand-over's relabelling (replica →
// primary) would update walship-ro's slice and walship-rw's together, and
// when walship-ro's reached kube-proxy first the new primary's joined
// walship-rw a minSyncPeriod later, the clients' writes waiting for it.
// With the reads label the hand-over changes walship-rw's slice alone,
// and walship-ro's a grace later, in a sync of its own.

// labelUnknown is a label a node has not set yet: at a start, its Pod may
// carry the labels of the process before it.
const labelUnknown = "?"

// readsOn is the reads label's value while it is set.
const readsOn = "true"

// promotionLabelGrace is how long a node keeps the role label it has once
// it is a primary that does not take writes yet, when that label is
// replica (a promotion) or one it has not set (a start): a promotion or a
// restart opens its epoch within it, and the relabelling then goes
// straight to primary, one patch, instead of replica → none → primary.
const promotionLabelGrace = 2 * time.Second

// readsLabelGrace is how long a primary keeps the reads label it had once
// it takes writes: more than kube-proxy's minSyncPeriod (1 s by default)
// with a margin, so that walship-ro's update reaches kube-proxy in a sync
// after the one that applies walship-rw's.
const readsLabelGrace = 2 * time.Second

// podLabels are a node's labels: role "primary", "replica", "" (none) or
// labelUnknown; reads readsOn, "" (none) or labelUnknown.
type podLabels struct {
	role, reads string
}

// labelTimes are what the graces count from: when the node became a
// primary that does not take writes yet (promoted), and when it began to
// take writes with its reads label kept (taking); zero when not so.
type labelTimes struct {
	promoted, taking time.Time
}

// nextLabels are the labels for a node that was last labelled last, and
// the new times: roleLabel's role, and readsLabel's reads.
func nextLabels(last podLabels, primary, takingWrites bool, t labelTimes, now time.Time) (podLabels, labelTimes) {
	var next podLabels
	next.role, t.promoted = roleLabel(last.role, primary, takingWrites, t.promoted, now)
	next.reads, t.taking = readsLabel(last.reads, next.role, primary, takingWrites, t.taking, now)
	return next, t
}

// roleLabel is the role label for a node that was last labelled last:
// "primary" while it takes writes, "replica" for a replica, none for a
// primary that does not take writes (it serves neither reads nor
// writes) — but a primary that does not take writes yet keeps a replica
// or unknown label for promotionLabelGrace after since (when it became
// one; zero when it is not one), and labelUnknown means leave the label
// as it is. It returns the label and the new since.
func roleLabel(last string, primary, takingWrites bool, since, now time.Time) (string, time.Time) {
	switch {
	case !primary:
		return "replica", time.Time{}
	case takingWrites:
		return "primary", time.Time{}
	case last != "replica" && last != labelUnknown:
		return "", time.Time{}
	}
	if since.IsZero() {
		since = now
	}
	if now.Sub(since) < promotionLabelGrace {
		return last, since
	}
	return "", time.Time{}
}

// readsLabel is the reads label for a node last labelled last whose role
// label is now role: on for a replica; none for a primary without a role
// label (it serves nothing); as it was while a promoting or starting
// primary keeps its role label (roleLabel); and for a primary that takes
// writes, as it was for readsLabelGrace after since (when it began to;
// zero when it does not), then none. A node that starts as a primary
// leaves an unknown label for the grace too: its Pod may carry the label
// from the process before it (a replica whose promotion was under way),
// and removing it with the role's change would move both Services at
// once. It returns the label and the new since.
func readsLabel(last, role string, primary, takingWrites bool, since, now time.Time) (string, time.Time) {
	switch {
	case !primary:
		return readsOn, time.Time{}
	case role == "":
		return "", time.Time{}
	case !takingWrites:
		return last, time.Time{}
	case last == "":
		return "", time.Time{}
	}
	if since.IsZero() {
		since = now
	}
	if now.Sub(since) < readsLabelGrace {
		return last, since
	}
	return "", time.Time{}
}

// labelWake wakes the labels loop when the node's labels should change
// now rather than at its next poll: a promotion's relabelling is on the
// clients' path to the new primary.
type labelWake struct {
	once sync.Once
	ch   chan struct{}
	// opened is the primary whose epoch has just opened (Opened runs
	// just before it takes writes), until the loop has seen it.
	opened atomic.Pointer[primary.Server]
}

func (w *labelWake) wakeCh() chan struct{} {
	w.once.Do(func() { w.ch = make(chan struct{}, 1) })
	return w.ch
}

// relabelNow wakes the labels loop.
func (n *Node) relabelNow() {
	select {
	case n.labelWake.wakeCh() <- struct{}{}:
	default:
	}
}

// labelOpened is the primary's Opened hook for the labels: its epoch
// opens, and it takes writes right after.
func (n *Node) labelOpened() {
	if prim := n.Primary(); prim != nil {
		n.labelWake.opened.Store(prim)
		n.relabelNow()
	}
}

// labels keeps the node's labels equal to its role (nextLabels), every
// retry period and at once when woken (relabelNow), until the node is
// told to stop (stopping): a stopping primary that hands over keeps its
// labels, since its pod has left the Services already, and a relabelling
// would only spend kube-proxy's minSyncPeriod before the new primary's.
func (n *Node) labels(ctx context.Context, stopping <-chan struct{}) {
	el := n.cfg.Election
	last, times := podLabels{labelUnknown, labelUnknown}, labelTimes{}
	wake := n.labelWake.wakeCh()
	poll := time.NewTimer(0)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-stopping:
			return
		case <-wake:
		case <-poll.C:
		}
		prim := n.Primary()
		// Woken by Opened, the primary may not take writes yet: it does
		// within microseconds if it holds the election (its gate), and the
		// loop takes its word for it once. Until it holds the election
		// (a switchover's target takes it over), opened waits for the
		// wake-up that follows (opened in auto.go).
		taking := prim != nil && prim.TakingWrites()
		if prim != nil && n.labelWake.opened.Load() == prim && (taking || el.Held()) {
			n.labelWake.opened.CompareAndSwap(prim, nil)
			taking = true
		}
		var next podLabels
		next, times = nextLabels(last, prim != nil, taking, times, time.Now())
		if next.role != labelUnknown {
			var reads *bool
			if next.reads != labelUnknown {
				r := next.reads == readsOn
				reads = &r
			}
			lctx, cancel := context.WithTimeout(ctx, 10*n.retry())
			if err := el.Label(lctx, next.role, reads); err != nil {
				n.logger.Warn("could not label the pod", "role", next.role, "reads", next.reads, "err", err)
			}
			cancel()
		}
		last = next
		poll.Reset(n.retry())
	}
}
