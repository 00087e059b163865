package replica

import (
	"sync"
	"sync/atomic"

	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/watermark"
)

// A replica applies what its primary has made durable, which can be ahead
// of what the cluster's contract has acknowledged (it must be: a commit
// that waits for a replica to apply commits only once applied). A failover
// whose quorum misses this replica can drop such a write. So plain reads
// and watches are served from a view at most at the commit watermark the
// primary sends (commit_lsn): state applied above it is kept in views not
// yet readable (MVCC by copy-on-write clones of the store, one per apply
// round), and the newest view at or below the watermark is published when
// the watermark reaches it.
//
// Across a restart: a clean stop saves the served view's LSN as the
// readable applied marker (replica.go), and a restart that replays to it
// serves reads there at once, neither past the watermark nor behind
// anything served before. Anything else — state above it (a re-seed's
// snapshot at the primary's visible LSN), a restart after a crash, an
// older version's marker — waits for the primary's watermark again.

// maxPendingViews bounds the views kept above the watermark. Each is an
// O(1) clone, but it makes the next apply copy the nodes it touches; when
// the watermark stalls (a member is down) every other view is dropped,
// which only makes reads staler, never newer than the watermark.
const maxPendingViews = 64

// readable holds the view reads are served from and the views waiting for
// the watermark. Only the follower changes it (and New, before).
type readable struct {
	mu      sync.Mutex
	commit  uint64        // highest commit watermark heard
	pending []*state.View // applied, above commit; ascending LSN
	// view is served; nil until one is at or below commit. Readers load
	// it without mu.
	view atomic.Pointer[state.View]
	// lsn is the served view's LSN, which reads (min_lsn) and watches
	// wait on: the watch feed's bound. Set before first use.
	lsn *watermark.Watermark
}

// applied records a view of the state after an apply, and publishes it
// at once if the watermark already covers it.
func (r *readable) applied(v *state.View) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.pending); n > 0 && r.pending[n-1].AppliedLSN() >= v.AppliedLSN() {
		r.pending[n-1] = v // same LSN (nothing new applied) or a reset
	} else {
		r.pending = append(r.pending, v)
	}
	if len(r.pending) > maxPendingViews {
		kept := r.pending[:0]
		for i, p := range r.pending {
			if i%2 == 1 || i == len(r.pending)-1 {
				kept = append(kept, p)
			}
		}
		clear(r.pending[len(kept):])
		r.pending = kept
	}
	r.publishLocked()
}

// reset drops every pending view (the store was replaced: a re-seed) and
// records v, the new store's view.
func (r *readable) reset(v *state.View) {
	r.mu.Lock()
	clear(r.pending)
	r.pending = r.pending[:0]
	r.mu.Unlock()
	r.applied(v)
}

// back replaces everything with v, a state behind the served one (a
// re-seed backwards after a divergence). The protocol never lets reads
// get there — they stay at or below the watermark, which no failover
// cuts — but a replica that applied entries it was not told were durable
// (a safety net, as in epoch.go) must not keep serving them: the view is
// dropped. The watermark heard is forgotten down to what stays served:
// it was heard along a history the replica has just left, so v, like a
// restart's state above its marker, waits for the new primary's word.
func (r *readable) back(v *state.View) {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.pending)
	r.pending = append(r.pending[:0], v)
	served := uint64(0)
	if cur := r.view.Load(); cur != nil && cur.AppliedLSN() > v.AppliedLSN() {
		r.view.Store(nil)
		r.lsn.Reset(0)
	} else if cur != nil {
		served = cur.AppliedLSN()
	}
	r.commit = min(r.commit, served)
	r.publishLocked()
}

// committed records the primary's commit watermark.
func (r *readable) committed(lsn uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if lsn <= r.commit {
		return
	}
	r.commit = lsn
	r.publishLocked()
}

// publishLocked serves the newest pending view at or below the watermark.
func (r *readable) publishLocked() {
	n := 0
	for n < len(r.pending) && r.pending[n].AppliedLSN() <= r.commit {
		n++
	}
	if n == 0 {
		return
	}
	v := r.pending[n-1]
	r.dropPublishable(n)
	if cur := r.view.Load(); cur != nil && v.AppliedLSN() < cur.AppliedLSN() {
		return // never back in time
	}
	r.view.Store(v)
	r.lsn.Advance(v.AppliedLSN())
}

// dropPublishable removes the first n pending views.
func (r *readable) dropPublishable(n int) {
	rest := copy(r.pending, r.pending[n:])
	clear(r.pending[rest:])
	r.pending = r.pending[:rest]
}

// current returns the served view, nil if none yet.
func (r *readable) current() *state.View { return r.view.Load() }

// commitLSN returns the highest commit watermark heard.
func (r *readable) commitLSN() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.commit
}
