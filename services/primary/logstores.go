package primary

import (
	"context"
	"slices"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// The log stores a primary works with are those of the contract in force
// (s.contract()), not its --logstore flags: a membership change adds,
// removes and replaces them at run time (change.go), and once one has
// (members_changed) a primary opening an epoch takes its log's
// (startContract). Shipping, snapshot uploads and the archiver follow the
// set (followLogStores); the lease needs a majority of each half
// (lease.setHalves), commits waiting for log stores likewise (ackrule.go).

// logStoreHalves are the log store sets of c that count: its own and,
// while a change is joint, next's.
func logStoreHalves(c *walshipv1.Contract) [][]string {
	hs := [][]string{c.GetLogstores()}
	if nx := c.GetNext(); nx != nil {
		hs = append(hs, nx.GetLogstores())
	}
	return hs
}

// logStoreSet is every log store of c the primary ships to, each once:
// both halves, then the learners.
func logStoreSet(c *walshipv1.Contract) []string {
	var out []string
	for _, a := range slices.Concat(c.GetLogstores(), c.GetNext().GetLogstores(), c.GetLogstoreLearners()) {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// logStores is every log store of the contract in force.
func (s *Server) logStores() []string {
	if f := s.inForce.Load(); f != nil {
		return f.logstores
	}
	return logStoreSet(s.startContract())
}

// logStoresChanged returns a channel closed when the set of log stores
// the primary ships to changes next. Take it before reading the set.
func (s *Server) logStoresChanged() <-chan struct{} {
	s.lsMu.Lock()
	defer s.lsMu.Unlock()
	if s.lsChanged == nil {
		s.lsChanged = make(chan struct{})
	}
	return s.lsChanged
}

// noteLogStores wakes followLogStores when the contract in force moves
// from before to after and their log store sets differ.
func (s *Server) noteLogStores(before, after *walshipv1.Contract) {
	if slices.Equal(logStoreSet(before), logStoreSet(after)) {
		return
	}
	s.lsMu.Lock()
	defer s.lsMu.Unlock()
	if s.lsChanged != nil {
		close(s.lsChanged)
		s.lsChanged = nil
	}
}

// followLogStores runs run(ctx, addr) for every log store of the contract
// in force, starting it for one that joins and cancelling it (and waiting
// for it) for one that leaves, then calling left(addr) if set, until ctx
// ends; it returns once every run has.
func (s *Server) followLogStores(ctx context.Context, run func(ctx context.Context, addr string), left func(addr string)) {
	type job struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	jobs := map[string]*job{}
	defer func() {
		for _, j := range jobs {
			j.cancel()
		}
		for _, j := range jobs {
			<-j.done
		}
	}()
	for {
		changed := s.logStoresChanged()
		want := s.logStores()
		for addr, j := range jobs {
			if slices.Contains(want, addr) {
				continue
			}
			j.cancel()
			<-j.done
			delete(jobs, addr)
			if left != nil {
				left(addr)
			}
		}
		for _, addr := range want {
			if jobs[addr] != nil {
				continue
			}
			jctx, cancel := context.WithCancel(ctx)
			j := &job{cancel: cancel, done: make(chan struct{})}
			jobs[addr] = j
			go func() {
				defer close(j.done)
				run(jctx, addr)
			}()
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// dropLogStore forgets a log store that left the contract: its position
// (Status, the archiver) and its lease echoes.
func (p *peers) dropLogStore(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.logstores, addr)
	if p.uploader == addr {
		p.uploader = ""
	}
	p.movedLocked()
}
