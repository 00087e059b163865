package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/walship/walship/internal/kube"
	"github.com/walship/walship/internal/logelect"
	"github.com/walship/walship/services/node"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
)

// nodeFlags are the flags of a data node, which `walship primary` and
// `walship replica` both run: the role is where a new node starts; a node
// whose data directory holds a vote starts in the role its vote says, is
// promoted in place (AdminService.Promote) and steps down to a replica
// when a newer epoch exists.
func nodeFlags(fs *flag.FlagSet, env *Env, role node.Role) func(context.Context) error {
	pc := primary.DefaultConfig()
	rc := replica.DefaultConfig()
	// Both on loopback by default: the metrics listener is plain HTTP
	// whatever the gRPC one is (a deployment binds what Prometheus and
	// its probes need, as deploy/k8s does).
	listen, metrics, id := "127.0.0.1:7401", "127.0.0.1:9401", "primary"
	if role == node.RoleReplica {
		listen, metrics, id = "127.0.0.1:7402", "127.0.0.1:9402", ""
	}
	var (
		cfg       node.Config
		logstores []string
		peers     peersFlag
	)
	fs.StringVar(&cfg.Listen, "listen", listen, "gRPC listen address")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", metrics, metricsListenHelp)
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for the WAL, snapshots and votes (required)")
	fs.StringVar(&cfg.ID, "id", id, "node id, stable across restarts: 1..64 of [A-Za-z0-9._-]")
	fs.Var(&peers, "peers", "the cluster's data nodes, this one among them, as id=address,... (needed to fail over: the contract counts them)")
	fs.StringVar(&cfg.Advertise, "advertise", "", "gRPC address other nodes and clients reach this node at (default: its --peers entry)")
	fs.BoolVar(&cfg.Join, "join", false, "a node whose --id is not in --peers starts as a replica, counted for nothing and never promoted, and asks the primary to add it at --advertise (walship ctl members add) until the log's contract names it; a node it names asks nothing (a StatefulSet scaled up)")
	fs.Var(listFlag{&logstores}, "logstore", "log store addresses, comma-separated: a primary ships to all (a majority makes --logstore-ack sync), a replica catches up from any that holds what it needs")
	fs.StringVar(&rc.Primary, "primary", "", "gRPC address of the primary a new replica follows (later: whoever won the newest epoch)")
	durabilityFlag(fs, &pc.Policy.Durability)
	fs.DurationVar(&pc.AsyncFlushInterval, "async-flush-interval", pc.AsyncFlushInterval, "longest time an async-durability commit stays unsynced (what a crash can lose)")
	replicationFlag(fs, &pc.Policy.Replication)
	fs.IntVar(&pc.Policy.SyncReplicas, "sync-replicas", pc.Policy.SyncReplicas, "k in 'any k replicas' for --replication sync")
	syncLevelFlag(fs, &pc.Policy.SyncLevel)
	fs.DurationVar(&pc.Policy.SyncTimeout, "sync-timeout", pc.Policy.SyncTimeout, "how long a sync commit waits for replicas or log stores before failing with UNAVAILABLE")
	logstoreAckFlag(fs, &pc.Policy.LogStore)
	fs.DurationVar(&pc.LogStoreSnapshotEvery, "logstore-snapshot-every", pc.LogStoreSnapshotEvery, "upload a state snapshot to each log store at most this often (0 = every snapshot the primary takes; negative = never): the log stores alone can then restore and re-seed replicas")
	fs.DurationVar(&pc.LogStoreSnapshotTimeout, "logstore-snapshot-timeout", pc.LogStoreSnapshotTimeout, "longest one snapshot upload to a log store may take")
	fs.DurationVar(&pc.LeaseTimeout, "lease-timeout", pc.LeaseTimeout, "how long a primary answers without word from a log store majority; a promotion waits it out (use one value cluster-wide)")
	fs.Int64Var(&pc.SegmentBytes, "segment-bytes", pc.SegmentBytes, "WAL segment size")
	fs.Int64Var(&pc.SnapshotEveryBytes, "snapshot-every-bytes", pc.SnapshotEveryBytes, "take a state snapshot after this many WAL bytes, or after as many as the last snapshot had if that is more")
	fs.IntVar(&pc.MaxValueBytes, "max-value-bytes", pc.MaxValueBytes, "largest value accepted")
	fs.IntVar(&pc.MaxTxnOps, "max-txn-ops", pc.MaxTxnOps, "most ops in one Txn (at most 10000)")
	fs.IntVar(&pc.MaxPipelineOps, "max-pipeline-ops", pc.MaxPipelineOps, "most operations of one KVService.Pipeline stream running at once; past it the stream is not read until one is answered (0 = 256)")
	fs.Var(codecFlag{&pc.Codec}, "codec", "WAL batch codec: msgpack or json")
	fs.DurationVar(&pc.HeartbeatInterval, "heartbeat-interval", pc.HeartbeatInterval, "heartbeat period on idle streams; a replica acks at least this often")
	fs.DurationVar(&pc.ReplicaTimeout, "replica-timeout", 0, "end a replica stream silent this long (0 = 10 heartbeat intervals)")
	fs.Int64Var(&pc.WALRetentionBytes, "wal-retention-bytes", pc.WALRetentionBytes, "keep at most this much WAL for replicas (past it they catch up from a log store or a snapshot)")
	fs.DurationVar(&pc.ShipDelay, "ship-delay", pc.ShipDelay, "longest a batch waits to be sent with the batches after it to a replica or log store no commit waits on (0 = each at once); commits that wait on them are never delayed")
	fs.Int64Var(&pc.MaxInflightCommitBytes, "max-inflight-commit-bytes", pc.MaxInflightCommitBytes, "bytes of write requests the primary holds until they are answered, all connections together; past it writes are refused RESOURCE_EXHAUSTED, not applied (0 = no bound)")
	fs.Int64Var(&pc.WriteQuotaBytesPerSecond, "write-quota-bytes-per-second", pc.WriteQuotaBytesPerSecond, "each client identity's write byte rate, as Kafka's client quotas; over it its writes are refused RESOURCE_EXHAUSTED, not applied, with the time to wait (0 = no quota)")
	fs.Int64Var(&pc.LearnerBytesPerSecond, "learner-bytes-per-second", pc.LearnerBytesPerSecond, "pace a learner's catch-up: as primary, send the WAL at most this fast to a replica whose acks count for nothing (a learner, a node not yet a member); as such a node, read from a log store at most this fast; so that the catch-up spares the members. A learner catches up only while writes are slower (0 = no limit)")
	fs.Int64Var(&pc.MaxReplicaLagBytes, "max-replica-lag-bytes", pc.MaxReplicaLagBytes, "cut off a replica stream this far behind (0 = never); it catches up from a log store")
	fs.DurationVar(&rc.FlushDelay, "flush-delay", rc.FlushDelay, "longest a replica's written batch waits for its fsync and apply while no sync commit waits on it (0 = every batch at once)")
	fs.Int64Var(&rc.MaxUnappliedBytes, "max-unapplied-bytes", rc.MaxUnappliedBytes, "memory for a replica's written batches waiting for the primary's durable LSN; beyond it they are read back from the WAL")
	var initialPrimary string
	if role == 0 {
		fs.StringVar(&initialPrimary, "initial-primary", "", "the --id of the node that bootstraps a new cluster as its primary; every other node starts as a replica (a node with data follows its vote)")
	}
	if role == node.RoleReplica {
		fs.BoolVar(&rc.ReadOnly, "read-only", false, "serve reads of --data-dir as it is, following no primary and never promoted (a directory walship restore built)")
	}
	// A replica reads the archive when neither the primary nor a log store
	// can serve it; data nodes never upload (the log stores do).
	addArchiveFlags(fs, &rc.Archive)
	fs.Uint64Var(&rc.ReadyMaxLag, "ready-max-lag", rc.ReadyMaxLag, "a replica says it is ready (/readyz) within this many LSNs of the primary, once it has heard the primary since it started (0 = any lag, heard or not)")
	fs.DurationVar(&rc.ReadyMaxLagTime, "ready-max-lag-time", rc.ReadyMaxLagTime, "a replica says it is ready (/readyz) only while walship_replica_lag_seconds is within this (0 = any): a replica cut off from the primary this long leaves the read Service")
	// On bare metal as on Kubernetes: a primary stopped for maintenance
	// leaves a primary behind rather than a cluster waiting for an operator
	// to promote one.
	fs.BoolVar(&cfg.SwitchoverOnStop, "switchover-on-stop", true, "a primary told to stop (SIGTERM, Ctrl-C) first switches over to its most advanced connected replica, within --switchover-timeout, then stops (false: stop at once, leaving no primary until one is promoted)")
	fs.DurationVar(&cfg.SwitchoverDelay, "switchover-delay", 0, "a primary told to stop keeps taking writes this long before it switches over (--switchover-on-stop): on Kubernetes, kube-proxy's minSyncPeriod plus a margin, so that the pod's removal from the Services and the new primary's addition reach the clients in separate syncs; it then keeps its stopped process up as long again, so that the connections kube-proxy still sends to its pod are refused, not left unanswered")
	fs.DurationVar(&cfg.SwitchoverTimeout, "switchover-timeout", node.DefaultSwitchoverTimeout, "how long a primary told to stop tries to switch over first (--switchover-on-stop); past it, it stops anyway")
	fs.IntVar(&pc.WatchMaxBytes, "watch-ring-bytes", 0, "memory for the recent transactions KVService.Watch serves from, with previous values (0 = 16 MiB); older positions are read from the WAL, without them")
	fs.DurationVar(&pc.WatchStall, "watch-stall", 0, "cut off a watcher that leaves a send blocked (does not read) this long (0 = 10s)")
	kf := addKubeFlags(fs, &cfg)
	af := addAutoFailoverFlags(fs)
	sf := addSecurityFlags(fs, true)
	return func(ctx context.Context) error {
		cfg.Logger = env.Logger.With("service", "node") // the node adds node=<id>
		cfg.Registry = newRegistry()
		if role == 0 {
			role = node.RoleReplica
			if initialPrimary == cfg.ID {
				role = node.RolePrimary
			}
		}
		if err := applyKube(kf, &cfg, cfg.Logger); err != nil {
			return err
		}
		sec, err := sf.serve(ctx, cfg.Logger, cfg.Listen, cfg.MetricsListen)
		if err != nil {
			return err
		}
		pc.Security, rc.Security = sec, sec
		rc.SegmentBytes, rc.SnapshotEveryBytes, rc.HeartbeatInterval = pc.SegmentBytes, pc.SnapshotEveryBytes, pc.HeartbeatInterval
		rc.WatchMaxBytes, rc.WatchStall, rc.MaxPipelineOps = pc.WatchMaxBytes, pc.WatchStall, pc.MaxPipelineOps
		rc.LearnerBytesPerSecond = pc.LearnerBytesPerSecond
		cfg.Role, cfg.Members, cfg.LogStores, cfg.Primary, cfg.Replica = role, peers.members, logstores, pc, rc
		closeElection, err := applyAutoFailover(af, kf, &cfg)
		if err != nil {
			return err
		}
		defer closeElection()
		n, err := node.New(cfg)
		if err != nil {
			return err
		}
		return n.Run(ctx)
	}
}

// peersFlag is --peers: id=address,...
type peersFlag struct{ members []primary.Member }

func (p *peersFlag) String() string {
	var parts []string
	for _, m := range p.members {
		parts = append(parts, m.ID+"="+m.Addr)
	}
	return strings.Join(parts, ",")
}

func (p *peersFlag) Set(s string) error {
	p.members = nil
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		id, addr, ok := strings.Cut(part, "=")
		if !ok || id == "" || addr == "" {
			return fmt.Errorf("%q: want id=address", part)
		}
		p.members = append(p.members, primary.Member{ID: id, Addr: addr})
	}
	return nil
}

func primaryFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	return nodeFlags(fs, env, node.RolePrimary)
}

func replicaFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	return nodeFlags(fs, env, node.RoleReplica)
}

func dataNodeFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	return nodeFlags(fs, env, 0)
}

// addKubeFlags adds the flags of automatic failover on Kubernetes: the
// Lease's to the returned config, the node's own to cfg.
func addKubeFlags(fs *flag.FlagSet, cfg *node.Config) *kube.Config {
	k := &kube.Config{LeaseDuration: kube.DefaultLeaseDuration, RenewDeadline: kube.DefaultRenewDeadline, RetryPeriod: kube.DefaultRetryPeriod}
	fs.StringVar(&k.Lease, "kube-lease", "", "fail over automatically on Kubernetes, with this coordination.k8s.io Lease deciding who may try (empty: off)")
	fs.StringVar(&k.Kubeconfig, "kubeconfig", "", "kubeconfig file for --kube-lease (default: the pod's service account)")
	fs.StringVar(&k.Pod, "pod-name", os.Getenv("POD_NAME"), "this node's Pod, labelled with its role (default $POD_NAME)")
	fs.StringVar(&k.Namespace, "pod-namespace", os.Getenv("POD_NAMESPACE"), "the namespace of the Pod and the Lease (default $POD_NAMESPACE)")
	fs.DurationVar(&k.LeaseDuration, "kube-lease-duration", k.LeaseDuration, "how long after its last renewal others may take the Lease, in whole seconds (a dead primary's failover waits this)")
	fs.DurationVar(&k.RenewDeadline, "kube-renew-deadline", k.RenewDeadline, "a primary that has not renewed the Lease for this long stops taking writes (at most 0.9 × (--kube-lease-duration − 1s))")
	fs.DurationVar(&k.RetryPeriod, "kube-retry-period", k.RetryPeriod, "how often the Lease is renewed or tried")
	fs.BoolVar(&k.LeaveOnScaleDown, "leave-on-scale-down", false, "with --kube-lease: a node told to stop whose StatefulSet's spec.replicas leaves out its pod's ordinal asks the primary to remove it from the members (after a primary's hand-over), within --leave-timeout; any other stop keeps it a member")
	fs.DurationVar(&cfg.LeaveTimeout, "leave-timeout", node.DefaultLeaveTimeout, "how long a node stopped for a scale-down (--leave-on-scale-down) tries to be removed before it stops anyway")
	fs.Uint64Var(&cfg.MaxFailoverLag, "max-failover-lag", node.DefaultMaxFailoverLag, "a replica contends for the Lease only within this many LSNs of the most advanced log")
	fs.DurationVar(&cfg.FailoverHolddown, "failover-holddown", node.DefaultFailoverHolddown, "no replica contends this soon after it saw the epoch change (against flapping)")
	return k
}

// autoFailoverFlags are the flags of automatic failover on the log stores.
type autoFailoverFlags struct {
	on  bool
	cfg logelect.Config
}

// addAutoFailoverFlags adds the flags of automatic failover held on the
// log stores (internal/logelect); --max-failover-lag and
// --failover-holddown (addKubeFlags) apply to it as well.
func addAutoFailoverFlags(fs *flag.FlagSet) *autoFailoverFlags {
	a := &autoFailoverFlags{cfg: logelect.Config{LeaseDuration: logelect.DefaultLeaseDuration, RenewDeadline: logelect.DefaultRenewDeadline, RetryPeriod: logelect.DefaultRetryPeriod}}
	fs.BoolVar(&a.on, "auto-failover", false, "fail over automatically with no outside coordinator: the log stores hold the election that says which node may try to become primary, and the most advanced eligible replica promotes itself when the primary stops renewing it (not with --kube-lease)")
	fs.DurationVar(&a.cfg.LeaseDuration, "election-lease", a.cfg.LeaseDuration, "--auto-failover: how long after the primary's last renewal, on each log store's clock, another node may win the election (a dead primary's failover waits this, or --lease-timeout if longer)")
	fs.DurationVar(&a.cfg.RenewDeadline, "election-renew-deadline", a.cfg.RenewDeadline, "--auto-failover: a primary that has not renewed the election at a log store majority for this long stops taking writes (at most 0.9 × --election-lease)")
	fs.DurationVar(&a.cfg.RetryPeriod, "election-retry-period", a.cfg.RetryPeriod, "--auto-failover: how often the election is renewed, and a replica checks whether it may contend")
	return a
}

// applyAutoFailover makes cfg fail over by the log stores' election, if
// --auto-failover is set; the returned func closes its connections.
func applyAutoFailover(a *autoFailoverFlags, k *kube.Config, cfg *node.Config) (func(), error) {
	if !a.on {
		return func() {}, nil
	}
	if k.Lease != "" {
		return nil, errors.New("--auto-failover: not with --kube-lease (one election at a time: the Lease on Kubernetes, the log stores' elsewhere)")
	}
	c := a.cfg
	c.ID, c.LogStores, c.Logger, c.Dialer = cfg.ID, cfg.LogStores, cfg.Logger.With("election", "logstores"), cfg.Primary.Security.Dialer
	el, err := logelect.New(c)
	if err != nil {
		return nil, err
	}
	cfg.Election, cfg.ElectionRetry = el, c.RetryPeriod
	return func() { _ = el.Close() }, nil
}

// applyKube makes cfg fail over by k's Lease, if --kube-lease is set.
func applyKube(k *kube.Config, cfg *node.Config, logger *slog.Logger) error {
	if k.Lease == "" {
		if k.LeaveOnScaleDown {
			return errors.New("--leave-on-scale-down: needs --kube-lease (the node reads its StatefulSet from the API server)")
		}
		return nil
	}
	k.Logger = logger
	c, err := kube.New(*k)
	if err != nil {
		return err
	}
	if cfg.ID != k.Pod {
		return fmt.Errorf("--id: %q must be the pod's name (--pod-name %q) with --kube-lease", cfg.ID, k.Pod)
	}
	cfg.Election = c
	cfg.ElectionRetry = k.RetryPeriod
	if k.LeaveOnScaleDown {
		if _, _, err := kube.StatefulSetOrdinal(k.Pod); err != nil {
			return fmt.Errorf("--leave-on-scale-down: %w", err)
		}
		cfg.Leaving = c.ScaledDown
	}
	return nil
}
