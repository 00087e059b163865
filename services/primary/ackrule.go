package primary

import (
	"math"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/failover"
)

// Acks follow the configuration of the newest contract record in the
// primary's log (docs/ARCHITECTURE.md, Membership change): under a plain
// contract a commit needs k of its members other than the primary and,
// when it waits for log stores, a majority of them; while a change is in
// progress (the record is joint) it needs that of both halves. The rule is
// worked out once per record (ruleOf, from failover.Config.AckQuorums) so
// that the commit path only looks positions up: no allocation per ack.

// ackRule is the ack rule of one configuration.
type ackRule struct {
	// members are the voters of each half (its members other than this
	// primary); a commit waiting for k replicas needs k of each. nil: no
	// member is configured, and every connected replica counts.
	members [][]string
	// logstores are each half's log stores and the majority it needs.
	// nil: a majority of every configured log store (peers.quorum).
	logstores []failover.Quorum
	// eligible are the voters of every half, for messages and for
	// checkSyncReplicas; minVoters the fewest voters of any half.
	eligible  map[string]bool
	minVoters int
}

// ruleOf is the ack rule of contract c for the primary named self. A
// contract without members keeps the rule of a primary without --peers:
// every replica counts, and a majority of the configured log stores.
func ruleOf(c *walshipv1.Contract, self string) ackRule {
	if len(c.GetMembers()) == 0 {
		return ackRule{}
	}
	r := ackRule{eligible: map[string]bool{}, minVoters: math.MaxInt}
	qs := failover.ConfigOf(c).AckQuorums(self)
	for i := 0; i+1 < len(qs); i += 2 {
		m, l := qs[i], qs[i+1]
		r.members = append(r.members, m.Voters)
		for _, v := range m.Voters {
			r.eligible[v] = true
		}
		r.minVoters = min(r.minVoters, len(m.Voters))
		// A commit may ask for log store acks when the contract does not:
		// every half then needs its majority.
		l.Need = failover.Majority(len(l.Voters))
		r.logstores = append(r.logstores, l)
	}
	return r
}

// setRule makes r the ack rule: every waiting commit, and the commit
// watermark, is judged by it from now on. Waiters it satisfies are
// released.
func (p *peers) setRule(r ackRule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rule = r
	p.ruleNow.Store(&r)
	p.movedLocked()
	for c, q := range p.replWaiters {
		if len(*q) > 0 {
			q.release(p.replicaQuorumLocked(c))
		}
	}
	if len(p.lsWaiters) > 0 {
		p.lsWaiters.release(p.logStoreQuorumLocked())
	}
}

// replicaQuorumLocked is the highest LSN that c.k connected replicas have
// reached at c.level, in every half of the configuration (0 if fewer than
// c.k of a half are connected).
func (p *peers) replicaQuorumLocked(c waitClass) uint64 {
	if p.rule.members == nil {
		var buf [8]uint64
		pos := buf[:0]
		for _, r := range p.replicas {
			if r.connected {
				pos = append(pos, r.pos(c))
			}
		}
		return failover.AckLSN(pos, c.k) // I5: the ack quorum a promotion meets
	}
	ack := uint64(math.MaxUint64)
	for _, voters := range p.rule.members {
		var buf [8]uint64
		pos := buf[:0]
		for _, id := range voters {
			if r := p.replicas[id]; r != nil && r.connected {
				pos = append(pos, r.pos(c))
			}
		}
		ack = min(ack, failover.AckLSN(pos, c.k)) // I5, in each half
	}
	return ack
}

// counts reports whether replica id's acks count for sync commits.
func (p *peers) counts(id string) bool { return p.rule.members == nil || p.rule.eligible[id] }

// logStoreQuorumLocked is the highest LSN a majority of the log stores
// has made durable, of each half's (0 without log stores).
func (p *peers) logStoreQuorumLocked() uint64 {
	if p.quorum == 0 {
		return 0
	}
	if p.rule.logstores == nil {
		var buf [8]uint64
		pos := buf[:0]
		for _, l := range p.logstores {
			pos = append(pos, l.durable)
		}
		return failover.AckLSN(pos, p.quorum) // I5
	}
	ack, any := uint64(math.MaxUint64), false
	for _, q := range p.rule.logstores {
		if q.Need == 0 {
			continue
		}
		any = true
		var buf [8]uint64
		pos := buf[:0]
		for _, addr := range q.Voters {
			if l := p.logstores[addr]; l != nil {
				pos = append(pos, l.durable)
			}
		}
		ack = min(ack, failover.AckLSN(pos, q.Need)) // I5, in each half
	}
	if !any {
		return 0
	}
	return ack
}
