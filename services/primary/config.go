package primary

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/pace"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc"
)

// Config configures a primary.
type Config struct {
	// Listen is the gRPC address.
	Listen string
	// MetricsListen is the HTTP address of /metrics; empty disables it.
	MetricsListen string
	// Security is TLS and authorization for the server (zero: plaintext).
	Security serve.Security
	// DataDir holds the WAL (DataDir/wal) and state snapshots (DataDir/snapshots).
	DataDir string
	// FS is the filesystem; nil means the real one. Tests inject faults here.
	FS vfs.FS

	// Policy is the default commit policy for writes that do not set their own.
	Policy Policy
	// WatchMaxBytes bounds the ring of recent transactions watches are
	// served from (0: changefeed.DefaultMaxBytes); older positions are read
	// from the WAL, without previous values.
	WatchMaxBytes int
	// WatchStall is how long a watcher may leave a Send blocked (it does
	// not read) before it is cut off (0: changefeed.DefaultStall).
	WatchStall time.Duration
	// AsyncFlushInterval bounds how long an async-durability commit stays
	// unsynced: what a crash can lose.
	AsyncFlushInterval time.Duration
	// SegmentBytes is the WAL segment size.
	SegmentBytes int64
	// SnapshotEveryBytes takes a state snapshot after this much WAL, or
	// after as much WAL as the last snapshot's size if that is more.
	SnapshotEveryBytes int64
	// MaxBatchBytes bounds one WAL batch; a larger transaction gets a batch of its own.
	MaxBatchBytes int
	// MaxValueBytes bounds a value.
	MaxValueBytes int
	// MaxTxnOps bounds the ops of one Txn (both branches together).
	MaxTxnOps int
	// MaxPipelineOps bounds the operations of one KVService.Pipeline
	// stream running at once; past it the server reads no more of the
	// stream until one is answered (0: kvpipe.DefaultMaxOps).
	MaxPipelineOps int
	// Codec encodes WAL batches.
	Codec codec.Codec

	// ID names this node among the cluster's data nodes (1..64 of
	// [A-Za-z0-9._-]; default "primary").
	ID string
	// Advertise is the gRPC address other nodes and clients reach this
	// node at (default: the address it listens on).
	Advertise string
	// Members are the cluster's data nodes, this one among them. Only the
	// other members' acks count for synchronous commits, and a promotion
	// needs answers from enough of them (the contract, stamped in every
	// epoch record). Empty: every replica counts, and a replica cannot be
	// promoted by an epoch vote.
	Members []Member
	// LeaseTimeout is how long the primary answers reads and writes
	// without hearing from a majority of the log stores (only with log
	// stores); a candidate waits it out before it opens.
	LeaseTimeout time.Duration
	// Gate, if set, is a condition outside the primary for answering
	// reads and writes (an automatic failover's election: services/node):
	// while it returns an error the primary refuses them, and a commit in
	// flight that it waited for is not acknowledged.
	Gate func() error
	// GateGrace is how long a commit in flight whose Gate closed waits
	// for it to open again before its outcome is unknown (0: not at all).
	// It looks at Gate again each time GateChanged's channel closes.
	GateGrace time.Duration
	// GateChanged returns a channel closed once Gate may have opened since
	// the call (the election renewed); required with GateGrace.
	GateChanged func() <-chan struct{}
	// Elected is an epoch a node has already won for this directory: the
	// primary begins it without an election.
	Elected *Elected
	// Register adds services to the primary's gRPC server.
	Register []func(*grpc.Server)
	// LogStores are the log store addresses the WAL is shipped to.
	LogStores []string
	// LogStoreSnapshotEvery spaces the uploads of state snapshots to each
	// log store: after a snapshot, it is uploaded if at least this long
	// has passed since the last upload began (else the newest snapshot is
	// uploaded once it has). 0 uploads every snapshot; negative none.
	LogStoreSnapshotEvery time.Duration
	// LogStoreSnapshotTimeout bounds one snapshot upload (0:
	// DefaultLogStoreSnapshotTimeout).
	LogStoreSnapshotTimeout time.Duration
	// ChangeResumeGrace is how long a primary whose log ended in a joint
	// record gives the members the change adds to connect before it rolls
	// the change back instead of finishing it (0: 10 s; change.go).
	ChangeResumeGrace time.Duration
	// ChangeRetryBackoff is how long a primary waits before it resumes a
	// membership change that a failed step left unfinished (a learner or
	// joint contract in force while it goes on serving), doubled after
	// every attempt that fails, up to 30 s (0: 1 s; change.go).
	ChangeRetryBackoff time.Duration
	// HeartbeatInterval is how often an idle stream carries a heartbeat.
	HeartbeatInterval time.Duration
	// ReplicaTimeout ends a replica stream that sent nothing for this long
	// (0 = 10 heartbeat intervals); the replica then no longer counts as
	// connected for sync commits and metrics.
	ReplicaTimeout time.Duration
	// WALRetentionBytes bounds the primary's WAL: older segments are removed
	// even if a replica still needs them (it then catches up from a log
	// store or a snapshot). Segments after the newest snapshot are always kept.
	WALRetentionBytes int64
	// MaxReplicaLagBytes cuts off a replica stream that falls further behind
	// (0 = no limit); the replica catches up from a log store.
	MaxReplicaLagBytes int64
	// LearnerBytesPerSecond paces the stream to a replica whose acks count
	// for nothing under the contract in force (a learner, or a node not yet
	// a member): the WAL goes to it at most this fast (pace.go), so that a
	// new node catching up from far behind does not take the CPU, disk and
	// network the members' commits need. A learner catches up only while
	// the write rate stays below it, at the difference, within the change's
	// catch-up timeout. A member's stream is never paced. 0 = no limit.
	LearnerBytesPerSecond int64
	// ShipDelay is the longest a written batch waits to go to a replica,
	// or a durable one to a log store, that no commit waits on, so that
	// the batches written meanwhile go with it: one socket write and one
	// round on the peer for several. A batch a commit waits on goes at
	// once. 0 sends every batch as soon as it can.
	ShipDelay time.Duration
	// MaxInflightCommitBytes bounds the bytes of the write requests the
	// primary holds, all connections together, from their arrival until
	// they are answered; past it a write is refused RESOURCE_EXHAUSTED,
	// not applied (admit.go). 0 = no bound.
	MaxInflightCommitBytes int64
	// WriteQuotaBytesPerSecond is each identity's write byte rate, as
	// Kafka's client quotas (admit.go); over it its writes are refused
	// RESOURCE_EXHAUSTED, not applied, with the time to wait. 0 = no quota.
	WriteQuotaBytesPerSecond int64

	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Registry receives the primary's metrics; nil means a private registry.
	Registry *prometheus.Registry
	// StopTimeout bounds the graceful stop.
	StopTimeout time.Duration
	// StreamGrace is how long long-lived streams go on after a graceful
	// stop begins (0: 1 s); a node switching roles sets it short.
	StreamGrace time.Duration
	// StatusHook adds to every AdminService.Status answer (a node adds
	// its failover timeline).
	StatusHook func(*walshipv1.StatusResponse)
	// Opened, if set, is called once, as the primary's epoch opens, just
	// before it takes writes: a node times its promotion's last phase by
	// it.
	Opened func()
}

// DefaultInflightCommitBytes is Config.MaxInflightCommitBytes's default:
// with the Go heap growing to twice what is live, writes in flight keep
// the primary within about 512 MiB, and at 1 KiB a write it admits about
// 256k of them at once, far more than group commit needs to keep the
// disk busy.
const DefaultInflightCommitBytes = 256 << 20

// DefaultLearnerBytesPerSecond is the default pace of a learner's stream
// (pace.DefaultLearnerBytesPerSecond).
const DefaultLearnerBytesPerSecond = pace.DefaultLearnerBytesPerSecond

// DefaultLogStoreSnapshotTimeout bounds one snapshot upload to a log
// store: a few GiB of state at the speed of a loaded disk.
const DefaultLogStoreSnapshotTimeout = 10 * time.Minute

// DefaultShipDelay is Config.ShipDelay's default: what an async
// replica's or log store's lag may grow by, against a socket write and a
// peer round per batch at low and middling rates.
const DefaultShipDelay = 2 * time.Millisecond

// DefaultLeaseTimeout is the primary's default lease: long enough that a
// loaded machine does not drop it between heartbeats (sent every quarter of
// it), short enough that a failover waits little for it.
const DefaultLeaseTimeout = time.Second

// Limits from the API contract (proto/walship/v1/kv.proto).
const (
	MaxKeyBytes       = 4096
	DefaultValueBytes = 1 << 20
	DefaultTxnOps     = 1000
)

// maxTxnOpsLimit bounds --max-txn-ops: a Txn's ops, compares and results
// are each held as a slice and a response entry, and ops of a few bytes
// each fit a request by the hundred thousand; like a Scan's pairs
// (kvread.MaxScanLimit), ten thousand is the most one call answers.
const maxTxnOpsLimit = 10000

// maxPipelineOpsLimit bounds --max-pipeline-ops: each operation in flight
// holds a goroutine and its request.
const maxPipelineOpsLimit = 65536

// DefaultConfig returns a Config with every default filled in; callers set
// DataDir and the addresses.
func DefaultConfig() Config {
	return Config{
		Listen:             "127.0.0.1:7401",
		Policy:             DefaultPolicy(),
		AsyncFlushInterval: 10 * time.Millisecond,
		SegmentBytes:       64 << 20,
		SnapshotEveryBytes: 64 << 20,
		MaxBatchBytes:      4 << 20,
		MaxValueBytes:      DefaultValueBytes,
		MaxTxnOps:          DefaultTxnOps,
		Codec:              codec.MsgPack,
		HeartbeatInterval:  time.Second,
		ShipDelay:          DefaultShipDelay,
		LeaseTimeout:       DefaultLeaseTimeout,
		WALRetentionBytes:  1 << 30,

		LogStoreSnapshotTimeout: DefaultLogStoreSnapshotTimeout,
		MaxReplicaLagBytes:      256 << 20,
		LearnerBytesPerSecond:   DefaultLearnerBytesPerSecond,
		MaxInflightCommitBytes:  DefaultInflightCommitBytes,
		StopTimeout:             30 * time.Second,
	}
}

// Validate reports the first invalid setting, naming its flag.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir: required"))
	}
	if c.GateGrace > 0 && (c.Gate == nil || c.GateChanged == nil) {
		errs = append(errs, errors.New("GateGrace: needs Gate and GateChanged"))
	}
	if c.Listen == "" {
		errs = append(errs, errors.New("--listen: required"))
	}
	if err := c.Policy.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("default policy: %w", err))
	}
	if c.AsyncFlushInterval <= 0 || c.AsyncFlushInterval > time.Minute {
		errs = append(errs, fmt.Errorf("--async-flush-interval: %v is not in (0, 1m]", c.AsyncFlushInterval))
	}
	if c.SegmentBytes < 64<<10 {
		errs = append(errs, fmt.Errorf("--segment-bytes: %d is below 64KiB", c.SegmentBytes))
	}
	if c.SnapshotEveryBytes <= 0 {
		errs = append(errs, fmt.Errorf("--snapshot-every-bytes: %d must be positive", c.SnapshotEveryBytes))
	}
	if c.MaxValueBytes < 1 || c.MaxValueBytes > maxValueLimit {
		errs = append(errs, fmt.Errorf("--max-value-bytes: %d is not in 1..%d (a batch holding one such value must fit a replication stream message)", c.MaxValueBytes, maxValueLimit))
	}
	if c.MaxTxnOps < 1 || c.MaxTxnOps > maxTxnOpsLimit {
		errs = append(errs, fmt.Errorf("--max-txn-ops: %d is not in 1..%d", c.MaxTxnOps, maxTxnOpsLimit))
	}
	if c.MaxPipelineOps < 0 || c.MaxPipelineOps > maxPipelineOpsLimit {
		errs = append(errs, fmt.Errorf("--max-pipeline-ops: %d is not in 0..%d", c.MaxPipelineOps, maxPipelineOpsLimit))
	}
	if c.MaxBatchBytes < 64<<10 || c.MaxBatchBytes > maxBatchLimit {
		errs = append(errs, fmt.Errorf("MaxBatchBytes: %d is not in 64KiB..%d (a batch must fit a replication stream message)", c.MaxBatchBytes, maxBatchLimit))
	}
	lease := c.LeaseTimeout
	if lease == 0 {
		lease = DefaultLeaseTimeout // as New fills it in
	}
	if c.ShipDelay < 0 || c.ShipDelay > time.Second || c.ShipDelay > lease/10 {
		// A log store stream that holds a batch sends no lease heartbeat
		// meanwhile: a tenth of the lease leaves the renewals their room.
		errs = append(errs, fmt.Errorf("--ship-delay: %v is not in [0, 1s] and at most a tenth of --lease-timeout %v", c.ShipDelay, lease))
	}
	if c.HeartbeatInterval <= 0 || c.HeartbeatInterval > time.Minute {
		errs = append(errs, fmt.Errorf("--heartbeat-interval: %v is not in (0, 1m]", c.HeartbeatInterval))
	}
	if c.LeaseTimeout < 0 || c.LeaseTimeout > time.Minute {
		errs = append(errs, fmt.Errorf("--lease-timeout: %v is not in (0, 1m]", c.LeaseTimeout))
	}
	if c.ID != "" && datadir.ValidateNodeID(c.ID) != nil {
		errs = append(errs, fmt.Errorf("--id: %v", datadir.ValidateNodeID(c.ID)))
	}
	ids := map[string]bool{}
	for _, m := range c.Members {
		switch {
		case datadir.ValidateNodeID(m.ID) != nil:
			errs = append(errs, fmt.Errorf("--peers: %s=%s: %v", m.ID, m.Addr, datadir.ValidateNodeID(m.ID)))
		case m.Addr == "" || ids[m.ID]:
			errs = append(errs, fmt.Errorf("--peers: %s=%s: want id=address, each id once", m.ID, m.Addr))
		}
		ids[m.ID] = true
	}
	if len(c.Members) > 0 && c.ID != "" && !ids[c.ID] {
		errs = append(errs, fmt.Errorf("--peers: this node's --id %q is not among them", c.ID))
	}
	if others := len(ids) - 1; len(c.Members) > 0 && c.Policy.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_SYNC && c.Policy.SyncReplicas > others {
		errs = append(errs, fmt.Errorf("--sync-replicas: %d is more than the %d other members (--peers) that can acknowledge a sync commit", c.Policy.SyncReplicas, others))
	}
	if c.ReplicaTimeout < 0 {
		errs = append(errs, fmt.Errorf("--replica-timeout: %v must not be negative", c.ReplicaTimeout))
	}
	if c.WALRetentionBytes < c.SegmentBytes {
		errs = append(errs, fmt.Errorf("--wal-retention-bytes: %d is below one segment (--segment-bytes %d)", c.WALRetentionBytes, c.SegmentBytes))
	}
	if c.LogStoreSnapshotTimeout < 0 {
		errs = append(errs, fmt.Errorf("--logstore-snapshot-timeout: %v must not be negative", c.LogStoreSnapshotTimeout))
	}
	if c.MaxInflightCommitBytes != 0 && c.MaxInflightCommitBytes < int64(c.MaxValueBytes) {
		errs = append(errs, fmt.Errorf("--max-inflight-commit-bytes: %d is below --max-value-bytes %d (0 = no bound)", c.MaxInflightCommitBytes, c.MaxValueBytes))
	}
	if c.WriteQuotaBytesPerSecond < 0 {
		errs = append(errs, fmt.Errorf("--write-quota-bytes-per-second: %d must not be negative (0 = no quota)", c.WriteQuotaBytesPerSecond))
	}
	if c.LearnerBytesPerSecond < 0 {
		errs = append(errs, fmt.Errorf("--learner-bytes-per-second: %d must not be negative (0 = no limit)", c.LearnerBytesPerSecond))
	}
	if c.MaxReplicaLagBytes < 0 {
		errs = append(errs, fmt.Errorf("--max-replica-lag-bytes: %d must not be negative", c.MaxReplicaLagBytes))
	}
	seen := map[string]bool{}
	for _, a := range c.LogStores {
		if a == "" || seen[a] {
			errs = append(errs, fmt.Errorf("--logstore: %q is empty or listed twice", a))
		}
		seen[a] = true
	}
	if c.Codec == nil {
		errs = append(errs, errors.New("--codec: required"))
	}
	return errors.Join(errs...)
}

// A WAL entry is one batch: transactions up to MaxBatchBytes of keys and
// values, or a single larger one, which the request limit (maxMessageBytes)
// bounds. Every entry goes to replicas and log stores as one stream
// message of at most streamMessageBytes. Encoded, a batch is larger than
// its keys and values (JSON's base64 is 4/3 of them, plus each record's
// LSN, transaction and op), so both bounds leave half the message spare.
const (
	maxBatchLimit = streamMessageBytes / 2
	maxValueLimit = streamMessageBytes/2 - MaxKeyBytes - 1<<20
)

// maxMessageBytes is the gRPC message limit that admits the largest valid
// request (a Txn of MaxTxnOps puts of maximal keys and values would exceed
// any sane limit, so the limit admits one maximal value plus headroom, and
// larger requests fail with ResourceExhausted naming the size).
func (c *Config) maxMessageBytes() int {
	return c.MaxValueBytes + MaxKeyBytes + 1<<20
}
