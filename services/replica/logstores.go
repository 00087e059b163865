package replica

import (
	"slices"
	"strings"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/failover"
	"google.golang.org/grpc"
)

// logStoreSets are the sets of log stores the replica asks who the
// primary is, and catches up from: those of the newest contract in its
// log once a run-time change wrote it (members_changed, or a joint
// record) — C_old's and, while joint, C_new's — and otherwise its
// --logstore flags, as one set (none if there are none). It is the
// primary's rule for the log stores it ships to and wins its epoch from
// (services/primary startContract): once a change moved the log stores,
// those the flags name may be removed ones, which no primary ships to any
// more and which keep naming a candidate that lost. Learners are not
// asked: they count for no promotion, so no majority is counted in them.
func (s *Server) logStoreSets() [][]string {
	c := s.EpochRecord().GetContract()
	if !failover.SetByChange(c) || len(c.GetLogstores()) == 0 {
		if len(s.cfg.LogStores) == 0 {
			return nil
		}
		return [][]string{s.cfg.LogStores}
	}
	sets := [][]string{c.GetLogstores()}
	// A joint record's next names no log stores when the change moves
	// members only: C_old's stay.
	if next := c.GetNext().GetLogstores(); len(next) > 0 && !sameSet(next, c.GetLogstores()) {
		sets = append(sets, next)
	}
	return sets
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// describeLogStores is sets for a message: "none", one set, or a joint
// pair.
func describeLogStores(sets [][]string) string {
	var parts []string
	for _, set := range sets {
		parts = append(parts, strings.Join(set, ","))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " and ")
}

// logStoresOf is every log store of sets, once each, dialled: those of
// the flags were dialled by New, the others are dialled the first time a
// set names them and kept until the replica stops. A log store that cannot
// be dialled (an address gRPC cannot parse) is left out, and logged.
func (s *Server) logStoresOf(sets [][]string) []*logStore {
	s.lsMu.Lock()
	defer s.lsMu.Unlock()
	var out []*logStore
	for _, set := range sets {
		for _, addr := range set {
			if slices.ContainsFunc(out, func(ls *logStore) bool { return ls.addr == addr }) {
				continue
			}
			ls := s.logstores[addr]
			if ls == nil {
				if s.lsClosed {
					continue
				}
				conn, err := grpc.NewClient(addr, s.dialLogStore...)
				if err != nil {
					s.logger.Warn("cannot dial a log store of the contract in the log", "logstore", addr, "err", err)
					continue
				}
				ls = &logStore{addr: addr, conn: conn, client: walshipv1.NewLogStoreServiceClient(conn)}
				s.logstores[addr] = ls
			}
			out = append(out, ls)
		}
	}
	return out
}
