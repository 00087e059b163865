// Package node runs a data node: one data directory that is the primary or
// a replica, one role at a time, changed at run time. It is the supervisor
// the services sit under (they never import each other): a replica is
// promoted in place by an epoch vote (promote.go); a primary that learns of
// a newer epoch steps down and rejoins as a replica of the new primary,
// without a restart and without anyone deleting data (its unreplicated
// tail is cut into an orphan file when the new primary says where the
// histories part).
//
// The node keeps its gRPC and metrics addresses across roles: the first
// role binds them, the next binds the same ones again.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
	"google.golang.org/protobuf/proto"
)

// Role is what the node is.
type Role int

// The roles.
const (
	RoleReplica Role = iota + 1
	RolePrimary
)

func (r Role) String() string {
	switch r {
	case RolePrimary:
		return "primary"
	case RoleReplica:
		return "replica"
	}
	return "unknown"
}

// Config configures a data node. Primary and Replica are templates of the
// two roles' configs: the node fills in what they share (ID, DataDir,
// addresses, log stores, members) and what it decides (the primary to
// follow, an elected epoch).
type Config struct {
	// ID names the node: 1..64 of [A-Za-z0-9._-], one of Members.
	ID string
	// DataDir is the node's data directory, whatever its role.
	DataDir string
	// Listen and MetricsListen are bound by the first role and kept.
	Listen, MetricsListen string
	// Advertise is the address other nodes and clients reach this node at
	// (default: Members' entry for ID).
	Advertise string
	// Members are the data nodes of the cluster, this one among them.
	Members []primary.Member
	// LogStores are the log store addresses.
	LogStores []string
	// Role is the role a node starts in when its data directory holds no
	// vote (a new cluster): one node bootstraps as primary, the others as
	// replicas. Later starts follow the vote: a node that was the primary
	// of its newest vote starts as primary (and rejoins as a replica if
	// its election finds a newer epoch), any other as a replica of that
	// vote's primary.
	Role Role
	// Primary is the template of the primary role's config.
	Primary primary.Config
	// Replica is the template of the replica role's config; Replica.Primary
	// is the primary a new replica starts following. With Replica.ReadOnly
	// the node stays a read-only replica: it is never promoted.
	Replica replica.Config
	// FS is the filesystem (nil: the real one).
	FS vfs.FS
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Registry receives the node's and its roles' metrics.
	Registry *prometheus.Registry

	// Election, if set, makes failover automatic (auto.go; on Kubernetes
	// a Lease, internal/kube): a primary takes writes only while it holds
	// it, an eligible replica that gets it promotes itself.
	Election Election
	// MaxFailoverLag is how many LSNs behind the most advanced log a
	// replica may be and still contend (0: DefaultMaxFailoverLag).
	MaxFailoverLag uint64
	// FailoverHolddown is how long after it saw the epoch change a
	// replica waits before it contends: one failover per holddown at
	// most, however the nodes flap.
	FailoverHolddown time.Duration
	// ElectionRetry is how often a replica checks whether it may contend
	// (0: DefaultElectionRetry).
	ElectionRetry time.Duration
	// SwitchoverOnStop makes a primary whose Run ends (SIGTERM) hand over
	// to its most advanced replica first, within SwitchoverTimeout
	// (0: DefaultSwitchoverTimeout).
	SwitchoverOnStop  bool
	SwitchoverTimeout time.Duration
	// SwitchoverDelay is how long a primary told to stop keeps taking
	// writes before it switches over. On Kubernetes the pod leaves the
	// Services' endpoints when it is deleted, and kube-proxy applies the
	// next change (the new primary's) only a minSyncPeriod (1 s by
	// default) after that: waiting it out on the old primary, which its
	// clients' open connections still reach, leaves them no gap but the
	// switchover's pause. After its stop such a primary keeps its process
	// up as long again (lingerAfterStop), for the same kube-proxy sync.
	SwitchoverDelay time.Duration
	// Join lets a node whose ID is not in Members start (a StatefulSet
	// scaled up): it starts as a replica, never a candidate until the
	// log's contract names it, and asks the primary to add it at
	// Advertise (join.go). A node the contract names already asks nothing.
	Join bool
	// Leaving, if set, is asked when the node is told to stop whether it
	// is going away for good (on Kubernetes: its StatefulSet scaled down
	// past its ordinal, internal/kube ScaledDown); if so it asks the
	// primary to remove it, within LeaveTimeout (0:
	// DefaultLeaveTimeout), after a primary's hand-over (join.go).
	Leaving      func(ctx context.Context) (down bool, why string, err error)
	LeaveTimeout time.Duration
}

// Node is a running data node.
type Node struct {
	cfg     Config
	logger  *slog.Logger
	fs      vfs.FS
	metrics *metrics

	addr, metricsAddr string

	mu       sync.Mutex
	role     Role
	prim     *primary.Server
	rep      *replica.Server
	timeline *walshipv1.FailoverTimeline // the last promotion, for Status
	// plans carries a promotion decided by Promote to Run, which carries
	// it out (the replica role must stop first, and Promote runs inside it).
	plans chan *plan
	// promoting is set while a promotion is under way on this node.
	promoting atomic.Bool
	// notEligible is why this replica may not contend ("": it may); under mu.
	notEligible string
	// seenEpoch and epochChanged: the epoch last seen by the election and
	// when it last changed (zero: never seen to); under mu.
	seenEpoch    uint64
	epochChanged time.Time
	// labelWake wakes the labels loop (label.go).
	labelWake labelWake
}

// New validates cfg, reads the data directory's vote to choose the role,
// and creates (binds) that role's server.
func New(cfg Config) (*Node, error) {
	if err := replica.ValidateID(cfg.ID); err != nil {
		return nil, fmt.Errorf("--id: %w", err)
	}
	if cfg.DataDir == "" {
		return nil, errors.New("--data-dir: required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.FS == nil {
		cfg.FS = vfs.OS
	}
	if cfg.Advertise == "" {
		for _, m := range cfg.Members {
			if m.ID == cfg.ID {
				cfg.Advertise = m.Addr
			}
		}
	}
	joining := len(cfg.Members) > 0 && !isMember(cfg.Members, cfg.ID)
	switch {
	case joining && !cfg.Join:
		return nil, fmt.Errorf("--peers: this node's --id %q is not among them (--join lets it start and ask the primary to add it)", cfg.ID)
	case cfg.Join && cfg.Advertise == "":
		return nil, errors.New("--advertise: required with --join when --peers does not name this node: the primary adds it at that address")
	case cfg.Join && cfg.Replica.ReadOnly:
		return nil, errors.New("--join: a read-only node follows no primary, so it cannot join")
	}
	n := &Node{cfg: cfg, logger: cfg.Logger.With("node", cfg.ID), fs: cfg.FS, plans: make(chan *plan, 1)}
	if err := cfg.FS.MkdirAll(cfg.DataDir, vfs.DirPerm); err != nil {
		return nil, err
	}
	v, err := datadir.LoadVote(cfg.FS, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	h, err := datadir.LoadHistory(cfg.FS, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	role := cfg.Role
	if v.Epoch > 0 {
		// The primary of its vote only if it opened that epoch: a vote for
		// itself from a promotion that failed or was cut short (the history
		// is saved only once the catch-up is done) makes it a replica.
		role = RoleReplica
		if v.Primary == cfg.ID && h.Current().Epoch == v.Epoch {
			role = RolePrimary
		}
	}
	if role == 0 || (joining && v.Epoch == 0) {
		role = RoleReplica // a joiner never bootstraps a cluster
	}
	if cfg.Replica.ReadOnly {
		if cfg.Election != nil {
			return nil, errors.New("--read-only: a read-only node is never promoted, so it takes no part in an election (drop --kube-lease)")
		}
		role = RoleReplica
	}
	if v.Epoch == 0 && role == RolePrimary && cfg.Election != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		exists, err := cfg.Election.Exists(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("bootstrap: cannot tell whether the cluster exists: %w", err)
		}
		if exists {
			n.logger.Warn("not bootstrapping: the cluster's election exists, so this empty node joins it as a replica")
			role = RoleReplica
		}
	}
	n.metrics = newMetrics(cfg.Registry, n)
	if err := n.become(role, v); err != nil {
		n.metrics.unregister()
		return nil, err
	}
	return n, nil
}

func isMember(ms []primary.Member, id string) bool {
	for _, m := range ms {
		if m.ID == id {
			return true
		}
	}
	return false
}

// Addr is the node's gRPC address.
func (n *Node) Addr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.addr
}

// MetricsAddr is the node's metrics address ("" when disabled).
func (n *Node) MetricsAddr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.metricsAddr
}

// Role is the node's current role.
func (n *Node) Role() Role {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.role
}

// Primary and Replica return the running role's server (nil for the other).
func (n *Node) Primary() *primary.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.prim
}

// Replica returns the replica server, if the node is a replica.
func (n *Node) Replica() *replica.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rep
}

// listen returns the addresses the next role binds: the configured ones
// the first time, the bound ones after.
func (n *Node) listen() (grpcAddr, metricsAddr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.addr == "" {
		return n.cfg.Listen, n.cfg.MetricsListen
	}
	return n.addr, n.metricsAddr
}

// become creates the server of role (not yet running). For a replica, v
// says which primary to follow (its address if known, else the configured
// one).
func (n *Node) become(role Role, v datadir.Vote) error {
	listen, metricsListen := n.listen()
	switch role {
	case RolePrimary:
		return n.newPrimary(listen, metricsListen, nil)
	default:
		cfg := n.cfg.Replica
		cfg.ID, cfg.DataDir, cfg.FS = n.cfg.ID, n.cfg.DataDir, n.cfg.FS
		cfg.Listen, cfg.MetricsListen = listen, metricsListen
		cfg.Logger, cfg.Registry = n.logger.With("role", "replica"), n.cfg.Registry
		if cfg.MaxValueBytes == 0 {
			// The writes it refuses are the ones it would take as primary.
			cfg.MaxValueBytes = n.cfg.Primary.MaxValueBytes
		}
		if len(cfg.LogStores) == 0 {
			cfg.LogStores = n.cfg.LogStores
		}
		if addr := n.primaryAddr(v); addr != "" {
			cfg.Primary = addr
		}
		if cfg.ReadOnly {
			cfg.Primary, cfg.LogStores, cfg.Archive = "", nil, archive.Config{} // follows no one
		} else if cfg.Primary == "" {
			// Any other member: one that is not the primary names the one
			// it knows (replication's NotPrimary).
			for _, m := range n.cfg.Members {
				if m.ID != n.cfg.ID {
					cfg.Primary = m.Addr
					break
				}
			}
		}
		if cfg.Primary == "" && !cfg.ReadOnly {
			return errors.New("--primary: required for a replica that knows of no primary yet")
		}
		cfg.Promote = n.promote
		cfg.StatusHook = n.statusHook
		cfg.StreamGrace = 100 * time.Millisecond
		s, err := replica.New(cfg)
		if err != nil {
			return err
		}
		n.mu.Lock()
		n.role, n.rep, n.prim = RoleReplica, s, nil
		n.addr, n.metricsAddr = s.Addr(), s.MetricsAddr()
		n.mu.Unlock()
	}
	n.metrics.setRole(role)
	return nil
}

func (n *Node) newPrimary(listen, metricsListen string, elected *primary.Elected) error {
	cfg := n.cfg.Primary
	cfg.ID, cfg.DataDir, cfg.FS = n.cfg.ID, n.cfg.DataDir, n.cfg.FS
	cfg.Listen, cfg.MetricsListen = listen, metricsListen
	cfg.Advertise, cfg.Members, cfg.LogStores = n.cfg.Advertise, n.cfg.Members, n.cfg.LogStores
	if n.cfg.Join && len(cfg.Members) > 0 {
		// Promoted once the log's contract named it (eligibility), so the
		// log's members win over these (join.go).
		cfg.Members = withSelf(cfg.Members, n.cfg.ID, n.cfg.Advertise)
	}
	cfg.Logger, cfg.Registry = n.logger.With("role", "primary"), n.cfg.Registry
	cfg.Elected = elected
	cfg.StatusHook = n.statusHook
	if elected != nil {
		// A promotion's last phase: until the epoch record meets the
		// contract and the primary holds its lease.
		starting := time.Now()
		cfg.Opened = func() {
			n.metrics.phase(phaseEpochOpen, starting)
			n.metrics.promotions.WithLabelValues("opened").Inc()
			n.mu.Lock()
			if tl := n.timeline; tl != nil && tl.GetEpoch() == elected.Epoch {
				tl = proto.Clone(tl).(*walshipv1.FailoverTimeline)
				tl.OpenedUnixNano = time.Now().UnixNano()
				n.timeline = tl
			}
			n.mu.Unlock()
		}
	}
	if n.cfg.Election != nil {
		cfg.Gate = n.gate
		cfg.GateChanged = n.cfg.Election.Renewed
		// A renewal that was only late (a busy API server) holds the
		// election again within a retry or two: a commit in flight waits
		// for that rather than answering with an unknown outcome.
		cfg.GateGrace = 10 * n.retry()
		// The Pod's labels follow the epoch's opening at once.
		timeOpened := cfg.Opened
		cfg.Opened = func() {
			if timeOpened != nil {
				timeOpened()
			}
			n.labelOpened()
		}
	}
	cfg.StreamGrace = 100 * time.Millisecond
	s, err := primary.New(cfg)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.role, n.prim, n.rep = RolePrimary, s, nil
	n.addr, n.metricsAddr = s.Addr(), s.MetricsAddr()
	n.mu.Unlock()
	n.metrics.setRole(RolePrimary)
	return nil
}

// primaryAddr is the address of v's primary: its own, else the member's.
func (n *Node) primaryAddr(v datadir.Vote) string {
	if v.Addr != "" {
		return v.Addr
	}
	for _, m := range n.cfg.Members {
		if m.ID == v.Primary && m.ID != n.cfg.ID {
			return m.Addr
		}
	}
	return ""
}

// Run runs the node until ctx ends: its role, and the next when it changes.
func (n *Node) Run(ctx context.Context) error {
	defer n.metrics.unregister()
	// Last, once the role and the election have stopped.
	linger := false
	defer func() {
		if linger {
			n.lingerAfterStop()
		}
	}()
	// The election outlives ctx until the role has stopped: a primary told
	// to stop hands over first, holding the Lease meanwhile.
	actx, stopElection := context.WithCancel(context.WithoutCancel(ctx))
	var electionDone sync.WaitGroup
	defer electionDone.Wait()
	defer stopElection()
	if n.cfg.Election != nil {
		electionDone.Add(2)
		go func() { defer electionDone.Done(); n.autoFailover(actx) }()
		go func() { defer electionDone.Done(); n.labels(actx, ctx.Done()) }()
	}
	if n.cfg.Join {
		electionDone.Add(1)
		go func() { defer electionDone.Done(); n.join(ctx) }()
	}
	for {
		n.mu.Lock()
		role, prim, rep := n.role, n.prim, n.rep
		n.mu.Unlock()
		// The role outlives ctx by as long as a primary takes to hand over
		// (SwitchoverOnStop).
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		stopped := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			defer close(stopped)
			if role == RolePrimary && n.cfg.SwitchoverOnStop {
				n.handOver(prim)
			}
			n.leaveIfScaledDown(role, prim, rep)
			cancel()
		})
		done := make(chan error, 1)
		if role == RolePrimary {
			go func() { done <- prim.Run(rctx) }()
		} else {
			go func() { done <- rep.Run(rctx) }()
		}
		// The loop is failover.Transition's state machine: state is where
		// the node is, each outcome below an event.
		state := failover.Replica
		if role == RolePrimary {
			state = failover.Primary
		}
		var err error
		var p *plan
		select {
		case err = <-done:
		case p = <-n.plans:
			state = n.transition(state, failover.Planned)
			// The old primary's lease runs out first, while this replica
			// (fenced, following no one) still serves its reads (I7).
			waiting := time.Now()
			n.waitLease(ctx, p)
			n.metrics.phase(phaseLeaseWait, waiting)
			cancel()
			err = <-done
		}
		if !stop() {
			<-stopped
		}
		cancel()
		var deposed *primary.DeposedError
		if ctx.Err() != nil {
			n.transition(state, failover.Stop)
			linger = role == RolePrimary && n.cfg.SwitchoverOnStop && n.cfg.SwitchoverDelay > 0
			if errors.As(err, &deposed) {
				return nil // told to stop, it handed over (or was fenced) first
			}
			return err
		}
		switch {
		case state == failover.LeaseWait && err == nil:
			state = n.transition(state, failover.RoleStoppedForPromotion)
			n.logger.Info("replica stopped for its promotion", "epoch", p.epoch)
			// While it waited out the lease, the replica may have promised
			// a newer epoch to another candidate: it keeps that promise (I4).
			perr := superseded(rep.Vote(), p.epoch, n.cfg.ID)
			if perr == nil {
				perr = n.carryOut(ctx, p)
			}
			if perr == nil && n.cfg.Election != nil {
				electionDone.Add(1)
				go func() { defer electionDone.Done(); n.opened(actx, p.epoch) }()
			}
			n.promoting.Store(false)
			if perr != nil {
				e := failover.OpenFailed
				if errors.Is(perr, errSuperseded) {
					e = failover.Superseded
				}
				n.transition(state, e)
				n.logger.Error("promotion stopped after fencing; back to the replica role", "epoch", p.epoch, "err", perr)
				n.noteFailure(p, perr)
				if err := n.become(RoleReplica, datadir.Vote{}); err != nil {
					return err
				}
			} else {
				n.transition(state, failover.Opened)
			}
		case state == failover.Primary && errors.As(err, &deposed):
			n.transition(state, failover.Deposed)
			n.metrics.stepDowns.Inc()
			// A promotion whose epoch a newer one fenced before it opened
			// failed: its timeline says so, as the caller waits on it.
			n.failUnopened(prim.Epoch(), fmt.Errorf("%w: %s before this node opened epoch %d", errSuperseded, deposed.Error(), prim.Epoch()))
			v := n.findPrimary(ctx, deposed.Vote)
			n.logger.Warn("stepped down; rejoining as a replica", "why", deposed.Why, "epoch", v.Epoch, "primary", v.Primary, "addr", v.Addr)
			if err := n.become(RoleReplica, v); err != nil {
				return err
			}
		default:
			n.transition(state, failover.RoleExited)
			return err
		}
	}
}

// transition is failover.Transition for the run loop: an event that
// cannot happen where the node is would be a bug in Run, logged.
func (n *Node) transition(s failover.NodeState, e failover.NodeEvent) failover.NodeState {
	next, ok := failover.Transition(s, e)
	if !ok {
		n.logger.Error("the run loop took an event its state does not have", "state", s.String(), "event", e.String())
	}
	return next
}

// handOver switches over to the most advanced connected replica that may
// lead under the primary's contract (SwitchoverOnStop), within
// SwitchoverTimeout. It logs why it did not, and never fails the stop:
// the primary stops anyway.
func (n *Node) handOver(prim *primary.Server) {
	// target is the replica to hand over to now, or "" once it logged why
	// there is none.
	target := func() (string, uint64) {
		st := prim.Status()
		target, best, why := handOverTarget(st.GetPeers(), st.GetContract(), n.cfg.ID)
		if target != "" && !prim.TakingWrites() {
			target, why = "", "this primary is not taking writes"
		}
		if target == "" {
			n.logger.Warn("stopping without a switchover: the cluster has no primary until one is promoted", "why", why)
		}
		return target, best
	}
	to, best := target()
	if to == "" {
		return
	}
	timeout := n.cfg.SwitchoverTimeout
	if timeout <= 0 {
		timeout = DefaultSwitchoverTimeout
	}
	if d := n.cfg.SwitchoverDelay; d > 0 {
		n.logger.Info("stopping: taking writes for --switchover-delay before the switchover", "delay", d)
		<-time.After(d)
		// The replicas may have moved on meanwhile.
		if to, best = target(); to == "" {
			return
		}
	}
	n.logger.Info("stopping: switching over first", "target", to, "flushed_lsn", best, "timeout", timeout)
	resp, err := prim.Switchover(context.Background(), to, timeout)
	if err != nil {
		n.logger.Error("switchover before stopping failed; stopping anyway", "target", to, "err", err)
		return
	}
	n.logger.Info("switched over before stopping", "target", to, "epoch", resp.GetEpoch(), "paused", resp.GetPaused().AsDuration())
}

// lingerAfterStop keeps a primary that stopped with SwitchoverDelay up,
// its listeners closed, for that long again. On Kubernetes its pod is
// terminating, and walship-rw has no ready endpoint until kube-proxy
// applies the new primary's (up to its minSyncPeriod, 1 s by default,
// after the hand-over), so kube-proxy still sends new connections to this
// pod meanwhile. While the process lives they are refused and the client
// dials again at once; once it has exited, the pod's network goes with it
// and they go unanswered until the client's connect timeout (1–20 s).
func (n *Node) lingerAfterStop() {
	d := n.cfg.SwitchoverDelay
	n.logger.Info("stopped; keeping the process up for --switchover-delay so that connections still sent here are refused, not left unanswered", "for", d)
	t := time.NewTimer(d)
	defer t.Stop()
	<-t.C
}

// handOverTarget is the connected replica, among the other members of
// contract c that may lead under it (failover.Config.Leads: no learner,
// no member joining or leaving in a change in progress — it would refuse
// to promote), that has flushed the most (ties: the first member
// listed), or "" and why none. The contract decides, not --peers: a node
// removed from it at run time may still be in the flag.
func handOverTarget(peers []*walshipv1.PeerStatus, c *walshipv1.Contract, self string) (target string, flushed uint64, why string) {
	qc := failover.ConfigOf(c)
	order := map[string]int{}
	for i, m := range qc.Old.Members {
		if m != self && qc.Leads(m) {
			order[m] = i + 1
		}
	}
	if len(order) == 0 {
		return "", 0, "no other member of the contract to switch over to"
	}
	why = "no replica that may lead under the contract is connected"
	for _, p := range peers {
		o := order[p.GetId()]
		if p.GetRole() != walshipv1.Role_ROLE_REPLICA || !p.GetConnected() || o == 0 {
			continue
		}
		if target == "" || p.GetFlushedLsn() > flushed || (p.GetFlushedLsn() == flushed && o < order[target]) {
			target, flushed, why = p.GetId(), p.GetFlushedLsn(), ""
		}
	}
	return target, flushed, why
}

// superseded is the error of a promotion to epoch whose candidate (id)
// has since promised a newer epoch, or nil if its vote is still its own.
func superseded(v datadir.Vote, epoch uint64, id string) error {
	if (failover.State{Vote: v}).Opens(epoch, id) {
		return nil
	}
	return fmt.Errorf("%w: this node promised epoch %d to %s (%s) while it waited to open epoch %d", errSuperseded, v.Epoch, v.Primary, v.Addr, epoch)
}

// errSuperseded marks a promotion that another, newer, superseded.
var errSuperseded = errors.New("superseded")

// findPrimary completes what a deposition said about the new primary with
// what the log stores say (the candidate's address, which a refusing
// replica does not know).
func (n *Node) findPrimary(ctx context.Context, v datadir.Vote) datadir.Vote {
	if n.primaryAddr(v) != "" {
		return v
	}
	own, _ := datadir.LoadCluster(n.fs, n.cfg.DataDir)
	for _, addr := range n.cfg.LogStores {
		st, err := logStoreStatus(ctx, n.dialer(), addr)
		if err == nil && rpcerr.CheckCluster("node", own, "log store", st.GetClusterId()) == nil && st.GetVoteEpoch() >= v.Epoch && datadir.CheckEpoch(st.GetVoteEpoch(), v.Epoch, datadir.MaxEpochGap) == nil && st.GetPrimaryAddr() != "" {
			return datadir.Vote{Epoch: st.GetVoteEpoch(), Primary: st.GetPrimaryId(), Addr: st.GetPrimaryAddr()}
		}
	}
	return v
}

// statusHook adds the node's failover timeline and its view of the
// election to Status.
func (n *Node) statusHook(resp *walshipv1.StatusResponse) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.timeline != nil {
		resp.LastFailover = proto.Clone(n.timeline).(*walshipv1.FailoverTimeline)
	}
	if ev, ok := n.cfg.Election.(ElectionViewer); ok {
		v, o := ev.LastView(), ev.LastOutcome()
		st := &walshipv1.ElectionStatus{
			HolderId: v.Holder, Term: v.Term, PrimaryAlive: v.Alive, AliveAt: uint32(v.AliveAt), Reached: uint32(v.Reached),
			Paused: v.Paused, Holding: ev.Held(), LastOutcome: o.What,
		}
		if !o.At.IsZero() {
			st.LastOutcomeUnixNano = o.At.UnixNano()
		}
		switch {
		case n.role == RolePrimary && st.Holding:
			st.Contend = "primary: holds the election"
		case n.role == RolePrimary:
			st.Contend = "primary: does not hold the election, so it takes no writes"
		case n.notEligible != "":
			st.Contend = n.notEligible
		default:
			st.Contend = "contending"
		}
		resp.Election = st
	}
}

// waitLease waits until the old primary's lease has run out (p.leaseUntil).
func (n *Node) waitLease(ctx context.Context, p *plan) {
	d := time.Until(p.leaseUntil)
	if d <= 0 {
		return
	}
	n.logger.Info("waiting out the old primary's lease", "for", d)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// epoch is the epoch of the node's current role.
func (n *Node) epoch() uint64 {
	n.mu.Lock()
	prim, rep := n.prim, n.rep
	n.mu.Unlock()
	switch {
	case prim != nil:
		return prim.Epoch()
	case rep != nil:
		return rep.Vote().Epoch
	}
	return 0
}
