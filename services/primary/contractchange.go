package primary

import (
	"context"
	"fmt"
	"slices"
	"strings"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/failover"
)

// A contract change at an epoch start. A primary restarted or promoted
// under new --peers (or log stores, or sync_replicas) writes an epoch
// record whose contract differs from the one before it, and the record
// and every write after it are acknowledged under the new contract. A
// candidate judges under the contracts it and its answerers have applied
// (services/node judgeAll): one that has not seen the record judges under
// the previous contract alone, and its quorum may miss every node that
// acknowledged a write under the new one — members {n0, n1}, any 1; the
// record names {n0, n1, n2}; n2 alone acknowledges W; n0, which never
// applied the record, promotes with its own promise and a log store
// majority, without W.
//
// So, before the primary opens, enough of the previous contract's members
// must have applied the record (and flushed it: a replica applies only
// what it flushed) that every promotion quorum of the previous contract
// holds one of them, and with it the new contract (a single-step change
// made safe by waiting, where a change at run time takes a joint record).

// changeWait is what an epoch record must reach under the previous
// contract before the primary opens: need of voters (members of the
// previous contract other than this primary) must have applied it.
type changeWait struct {
	voters []string
	need   int
	why    string
}

// epochChangeWait is the wait the epoch record of contract next needs
// when the contract before it was prev (nil: none, as in a new cluster),
// for a primary named self; ok is false when it needs none:
//
//   - prev and next have the same members, log stores, sync_replicas and
//     log store sync (a change of the level or the lease moves no quorum);
//   - next waits for nobody (k = 0, no log store sync): nothing
//     acknowledged under it was promised;
//   - next waits for a majority of the same log stores as prev: every
//     promotion quorum of prev holds a majority of them, which meets the
//     majority each write under next reached;
//
// Otherwise, when prev waits for k > 0 members without log store sync,
// its promotion quorum is N−k+1 of its N members other than the replaced
// primary (failover.PromotionNeed), so k of its members other than this
// primary must apply the record (k+1 when this primary is not one of
// them: the replaced primary a candidate names may be one of those k).
// When prev needs no member for a promotion (k = 0, or log store sync),
// a candidate's own promise may be the only member's in its quorum: every
// member of prev other than this primary must apply the record.
func epochChangeWait(prev, next *walshipv1.Contract, self string) (changeWait, bool) {
	if prev == nil || !contractChanged(prev, next) {
		return changeWait{}, false
	}
	if next.GetSyncReplicas() == 0 && !next.GetLogstoreSync() {
		return changeWait{}, false
	}
	if next.GetLogstoreSync() && sameSet(prev.GetLogstores(), next.GetLogstores()) {
		return changeWait{}, false
	}
	var w changeWait
	member := false
	for _, m := range prev.GetMembers() {
		if m.GetId() == self {
			member = true
		} else {
			w.voters = append(w.voters, m.GetId())
		}
	}
	k := int(prev.GetSyncReplicas())
	switch {
	case failover.PromotionNeed(len(w.voters), k, prev.GetLogstoreSync()) == 0:
		w.need = len(w.voters)
		w.why = "the previous contract needs no member for a promotion (sync_replicas 0 or log store sync), so every one of its members"
	case member:
		w.need = min(k, len(w.voters))
		w.why = fmt.Sprintf("the previous contract waits for any %d member(s), so %d of its members other than this primary", k, w.need)
	default:
		w.need = min(k+1, len(w.voters))
		w.why = fmt.Sprintf("the previous contract waits for any %d member(s) and does not name this primary, so %d of its members", k, w.need)
	}
	return w, w.need > 0
}

// contractChanged reports whether next changes what a promotion quorum
// or an ack quorum is made of: the members, the log stores, k or log
// store sync.
func contractChanged(prev, next *walshipv1.Contract) bool {
	ids := func(c *walshipv1.Contract) []string {
		var out []string
		for _, m := range c.GetMembers() {
			out = append(out, m.GetId())
		}
		return out
	}
	return !sameSet(ids(prev), ids(next)) || !sameSet(prev.GetLogstores(), next.GetLogstores()) ||
		prev.GetSyncReplicas() != next.GetSyncReplicas() || prev.GetLogstoreSync() != next.GetLogstoreSync()
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// waitApplied blocks until w.need of w.voters have applied and flushed
// lsn, or ctx ends; the error then says which have.
func (p *peers) waitApplied(ctx context.Context, lsn uint64, w changeWait) error {
	// Replica streams ask for apply acks while a wait at apply is counted.
	waiting := &p.waiting[walshipv1.SyncLevel_SYNC_LEVEL_APPLY]
	waiting.Add(1)
	defer waiting.Add(-1)
	p.announceWait()
	for {
		p.mu.Lock()
		var have []string
		for _, id := range w.voters {
			if r := p.replicas[id]; r != nil && min(r.applied, r.flushed) >= lsn {
				have = append(have, id)
			}
		}
		if len(have) >= w.need {
			p.mu.Unlock()
			return nil
		}
		if p.changed == nil {
			p.changed = make(chan struct{})
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%d of the previous contract's members %s have applied it (%s), %d needed",
				len(have), strings.Join(w.voters, ", "), strings.Join(have, ", "), w.need)
		}
	}
}
