package primary

import (
	"context"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// Membership (issue 38): what the primary reports of the configuration.
// The contract in force is the epoch record's (s.contract()); while a
// change is in progress its next half is set, and learners are listed
// apart. The voice of each member is Voices', the positions the peers'.

func (a *adminServer) ListMembers(context.Context, *walshipv1.ListMembersRequest) (*walshipv1.ListMembersResponse, error) {
	return &walshipv1.ListMembersResponse{Membership: a.s.membership(time.Now())}, nil
}

// membership is the configuration in force and each member's place and
// position, as of now.
func (s *Server) membership(now time.Time) *walshipv1.MembershipStatus {
	c := s.contract()
	last := s.wal.LastLSN()
	ms := &walshipv1.MembershipStatus{Epoch: s.epoch, PrimaryId: s.cfg.ID, Contract: c, Joint: c.GetNext() != nil, LastLsn: last,
		Change: s.changes.inProgress()}
	if f := s.inForce.Load(); f != nil {
		ms.Stage = f.stage
	}
	replicas, logstores := s.peers.snapshot()
	for _, m := range Voices(c, s.cfg.ID) {
		switch {
		case m.GetRole() == walshipv1.Role_ROLE_PRIMARY:
			m.Connected, m.ReachedLsn = true, last
		case m.GetRole() == walshipv1.Role_ROLE_LOGSTORE:
			for _, l := range logstores {
				if l.addr == m.GetId() {
					m.Connected, m.ReachedLsn = l.connected, l.durable
				}
			}
		default:
			for _, r := range replicas {
				if r.id == m.GetId() {
					m.Connected, m.ReachedLsn = r.connected, r.applied
				}
			}
		}
		if m.GetRole() != walshipv1.Role_ROLE_PRIMARY {
			bytes, age := s.pipe.index.lag(m.GetReachedLsn(), now)
			m.LagRecords, m.LagBytes, m.LagSeconds = last-min(last, m.GetReachedLsn()), bytes, age.Seconds()
		}
		ms.Members = append(ms.Members, m)
	}
	return ms
}

// Voices lists every data node and log store of contract c (the primary
// named primary among them) once, with what it counts for: in the
// current configuration and, while c is joint, in next; learners last.
// Data nodes come first, in the order the contract names them, then log
// stores, then learners (data nodes, then log stores).
func Voices(c *walshipv1.Contract, primary string) []*walshipv1.MemberStatus {
	next := c.GetNext()
	joint := next != nil
	inNext := map[string]bool{}
	for _, m := range next.GetMembers() {
		inNext[m.GetId()] = true
	}
	for _, l := range next.GetLogstores() {
		inNext["ls:"+l] = true
	}
	voice := func(key string) walshipv1.MemberVoice {
		if joint && !inNext[key] {
			return walshipv1.MemberVoice_MEMBER_VOICE_LEAVING
		}
		return walshipv1.MemberVoice_MEMBER_VOICE_VOTER
	}
	seen := map[string]bool{}
	var out []*walshipv1.MemberStatus
	add := func(key string, m *walshipv1.MemberStatus) {
		if !seen[key] {
			seen[key] = true
			out = append(out, m)
		}
	}
	node := func(m *walshipv1.Member, v walshipv1.MemberVoice) {
		role := walshipv1.Role_ROLE_REPLICA
		if m.GetId() == primary {
			role, v = walshipv1.Role_ROLE_PRIMARY, walshipv1.MemberVoice_MEMBER_VOICE_PRIMARY
		}
		add(m.GetId(), &walshipv1.MemberStatus{Id: m.GetId(), Addr: m.GetAddr(), Role: role, Voice: v})
	}
	store := func(addr string, v walshipv1.MemberVoice) {
		add("ls:"+addr, &walshipv1.MemberStatus{Id: addr, Addr: addr, Role: walshipv1.Role_ROLE_LOGSTORE, Voice: v})
	}
	for _, m := range c.GetMembers() {
		node(m, voice(m.GetId()))
	}
	for _, m := range next.GetMembers() {
		node(m, walshipv1.MemberVoice_MEMBER_VOICE_JOINING)
	}
	for _, l := range c.GetLogstores() {
		store(l, voice("ls:"+l))
	}
	for _, l := range next.GetLogstores() {
		store(l, walshipv1.MemberVoice_MEMBER_VOICE_JOINING)
	}
	for _, m := range c.GetLearners() {
		node(m, walshipv1.MemberVoice_MEMBER_VOICE_LEARNER)
	}
	for _, l := range c.GetLogstoreLearners() {
		store(l, walshipv1.MemberVoice_MEMBER_VOICE_LEARNER)
	}
	return out
}
