package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/pace"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc"
)

// Config configures a replica.
type Config struct {
	// Listen is the gRPC address (KV reads, Admin, health, reflection).
	Listen string
	// MetricsListen is the HTTP address of /metrics; empty disables it.
	MetricsListen string
	// Security is TLS and authorization for the server (zero: plaintext).
	Security serve.Security
	// DataDir holds the WAL (DataDir/wal), state snapshots
	// (DataDir/snapshots) and the highest epoch seen (DataDir/epoch).
	DataDir string
	// ID names the replica to the primary: 1..64 of [A-Za-z0-9._-], stable
	// across restarts (the primary uses it as a metric label).
	ID string
	// Primary is the gRPC address of the primary to follow.
	Primary string
	// ReadOnly serves reads of the data directory as it is, following no
	// one and promising nothing (a restored directory: walship restore).
	ReadOnly bool
	// WatchMaxBytes bounds the ring of recent transactions watches are
	// served from (0: changefeed.DefaultMaxBytes); older positions are read
	// from the WAL, without previous values.
	WatchMaxBytes int
	// WatchStall is how long a watcher may leave a Send blocked (it does
	// not read) before it is cut off (0: changefeed.DefaultStall).
	WatchStall time.Duration
	// MaxPipelineOps bounds the operations of one KVService.Pipeline
	// stream running at once (0: kvpipe.DefaultMaxOps), as the primary's.
	MaxPipelineOps int
	// ReadyMaxLag is how many LSNs behind the primary's last report the
	// replica may be and still say it is ready (/readyz); 0 means any.
	// With a bound, a replica is not ready until the primary has reported
	// its last LSN since the replica started.
	ReadyMaxLag uint64
	// ReadyMaxLagTime is how far behind in time (walship_replica_lag_seconds:
	// the age of the oldest write the primary had and the replica has not
	// applied, or the silence since it last heard upstream) the replica may
	// be and still say it is ready; 0 means any. It is what takes a replica
	// cut off from its primary out of the read Service.
	ReadyMaxLagTime time.Duration
	// LogStores are the gRPC addresses of the log stores to catch up from
	// when the primary no longer retains what the replica needs: the rung
	// reads from any of them that holds the LSN (catchup.go), and to ask
	// who the primary is. Once a run-time change wrote the newest contract
	// in the replica's log, that contract's log stores are used instead
	// (logStoreSets). Empty, with no such contract, skips that rung of the
	// catch-up ladder.
	LogStores []string
	// MaxValueBytes is the largest value a write may carry (the
	// primary's --max-value-bytes; 0: 1 MiB). A replica refuses writes,
	// but reads one whole to answer where the primary is, so its gRPC
	// receive limit is this plus the largest key and 1 MiB; nothing else
	// it is sent comes near that.
	MaxValueBytes int
	// Archive is the cluster's archive (internal/archive), read when
	// neither the primary nor a log store can serve the replica: the
	// archive rung (archive.go). The replica only reads it. Unset skips
	// that rung.
	Archive archive.Config
	// FS is the filesystem; nil means the real one. Tests inject faults here.
	FS vfs.FS

	// SegmentBytes is the WAL segment size.
	SegmentBytes int64
	// SnapshotEveryBytes takes a state snapshot (and truncates the WAL)
	// after this many WAL bytes were written since the last one, or after
	// as many as the last snapshot's size if that is more.
	SnapshotEveryBytes int64
	// HeartbeatInterval is how often the replica acks when nothing else
	// was sent, and the unit of staleness for the lag metric: with no
	// message from the primary for 3 intervals the replica counts itself
	// partitioned and its lag grows.
	HeartbeatInterval time.Duration
	// FlushDelay is how long written batches may wait for their fsync and
	// apply while the primary is not waiting on this replica, so one fsync
	// covers many rounds (the disk is usually shared); a sync commit's
	// reply request flushes at once. 0 flushes every round.
	FlushDelay time.Duration
	// MaxUnappliedBytes bounds the payload bytes of written batches kept
	// decoded in memory while they wait for the primary's durable LSN;
	// beyond it they are read back from the WAL to be applied. 0 keeps none.
	MaxUnappliedBytes int64
	// LearnerBytesPerSecond paces what the replica reads from a log store
	// while the newest contract it holds names members and not it (a
	// learner, or a node not yet a member): at most this many batch bytes
	// a second (catchup.go), as the primary paces its stream to such a
	// node, so that a new node's catch-up does not take the log stores'
	// and the cores' time the members' commits need. 0 = no limit.
	LearnerBytesPerSecond int64

	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Registry receives the replica's metrics; nil means a private registry.
	Registry *prometheus.Registry
	// StopTimeout bounds the graceful stop.
	StopTimeout time.Duration
	// StreamGrace is how long long-lived streams go on after a graceful
	// stop begins (0: 1 s); a node switching roles sets it short.
	StreamGrace time.Duration
	// StatusHook adds to every AdminService.Status answer (a node adds
	// its failover timeline).
	StatusHook func(*walshipv1.StatusResponse)
	// Register adds services to the replica's gRPC server (a node adds its
	// failover RPCs).
	Register []func(*grpc.Server)
	// Promote serves AdminService.Promote; nil refuses it (a replica run
	// on its own cannot turn into a primary: a node can).
	Promote func(context.Context, *walshipv1.PromoteRequest) (*walshipv1.PromoteResponse, error)
	// DialOptions are added to the options used to dial the primary and the
	// log store (after insecure transport credentials, so they can override
	// them).
	DialOptions []grpc.DialOption
}

// DefaultConfig returns a Config with every default filled in; callers set
// DataDir, ID and Primary.
func DefaultConfig() Config {
	return Config{
		Listen:             "127.0.0.1:7402",
		MetricsListen:      "127.0.0.1:9402",
		SegmentBytes:       64 << 20,
		SnapshotEveryBytes: 64 << 20,
		HeartbeatInterval:  time.Second,
		FlushDelay:         5 * time.Millisecond,
		MaxUnappliedBytes:  64 << 20,
		StopTimeout:        30 * time.Second,
		ReadyMaxLag:        10000,

		LearnerBytesPerSecond: pace.DefaultLearnerBytesPerSecond,
	}
}

// ValidateID checks a replica id: a node id (datadir.ValidateNodeID).
func ValidateID(id string) error { return datadir.ValidateNodeID(id) }

// Validate reports every invalid setting, naming its flag.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir: required"))
	}
	if c.Listen == "" {
		errs = append(errs, errors.New("--listen: required"))
	}
	if c.ID == "" {
		errs = append(errs, errors.New("--id: required"))
	} else if err := ValidateID(c.ID); err != nil {
		errs = append(errs, fmt.Errorf("--id: %w", err))
	}
	switch {
	case c.ReadOnly && (c.Primary != "" || len(c.LogStores) > 0 || c.Archive.Set()):
		errs = append(errs, errors.New("--read-only: a read-only node follows no primary, no log store and no archive (drop --primary, --logstore and --archive)"))
	case c.Primary == "" && !c.ReadOnly:
		errs = append(errs, errors.New("--primary: required"))
	}
	if c.SegmentBytes < 64<<10 {
		errs = append(errs, fmt.Errorf("--segment-bytes: %d is below 64KiB", c.SegmentBytes))
	}
	if c.SnapshotEveryBytes <= 0 {
		errs = append(errs, fmt.Errorf("--snapshot-every-bytes: %d must be positive", c.SnapshotEveryBytes))
	}
	if c.FlushDelay < 0 || c.FlushDelay > time.Second {
		errs = append(errs, fmt.Errorf("--flush-delay: %v is not in [0, 1s]", c.FlushDelay))
	}
	if c.MaxUnappliedBytes < 0 {
		errs = append(errs, fmt.Errorf("--max-unapplied-bytes: %d is negative", c.MaxUnappliedBytes))
	}
	if c.LearnerBytesPerSecond < 0 {
		errs = append(errs, fmt.Errorf("--learner-bytes-per-second: %d must not be negative (0 = no limit)", c.LearnerBytesPerSecond))
	}
	if err := c.Archive.Validate(); err != nil {
		errs = append(errs, err)
	}
	for i, ls := range c.LogStores {
		if ls == "" {
			errs = append(errs, fmt.Errorf("--logstore: entry %d is empty", i))
		}
	}
	if c.ReadyMaxLagTime < 0 {
		errs = append(errs, fmt.Errorf("--ready-max-lag-time: %v is negative", c.ReadyMaxLagTime))
	}
	if c.HeartbeatInterval < time.Millisecond || c.HeartbeatInterval > time.Minute {
		errs = append(errs, fmt.Errorf("--heartbeat-interval: %v is not in [1ms, 1m]", c.HeartbeatInterval))
	}
	return errors.Join(errs...)
}
