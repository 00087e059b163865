package logstore

import (
	"context"
	"errors"
	"fmt"
	"github.com/walship/walship/internal/serve"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/walship/walship/internal/vfs"
)

// Config configures a log store.
type Config struct {
	// Listen is the gRPC address.
	Listen string
	// MetricsListen is the HTTP address of /metrics; empty disables it.
	MetricsListen string
	// Security is TLS and authorization for the server (zero: plaintext).
	Security serve.Security
	// DataDir holds the WAL (DataDir/wal), the base snapshots
	// (DataDir/snapshots) and the vote and epoch history.
	DataDir string
	// FS is the filesystem; nil means the real one. Tests inject faults here.
	FS vfs.FS

	// SegmentBytes is the WAL segment size: the unit retention removes.
	SegmentBytes int64
	// RetentionBytes bounds the bytes kept: whole old segments are removed
	// while the log is bigger (the active segment is always kept). 0 keeps
	// everything.
	RetentionBytes int64
	// RetentionAge removes whole segments whose newest batch was committed
	// (by the primary's clock, commit_time_unix_nano) longer ago than this.
	// 0 keeps everything.
	RetentionAge time.Duration
	// FlushDelay spaces write rounds (each one fsync) while no commit waits
	// on the log store; a heartbeat asking for a reply starts a round at
	// once. 0 writes and fsyncs every arrival at once.
	FlushDelay time.Duration
	// MaxMessageBytes bounds a gRPC message: it must admit the largest batch
	// a primary sends.
	MaxMessageBytes int
	// Peers are the gRPC addresses of the cluster's other log stores (this
	// one may be listed too: it recognises itself and skips it). A log
	// store with peers that starts empty, or finds that its log ends
	// before the oldest batch its primary still has, copies what it lacks
	// from the peer that holds it before it takes the primary's stream
	// again (refill.go). Empty, and no Archive: it never refills.
	Peers []string
	// Archive, if its URL is set, is the archive this log store uploads
	// its log and base snapshots to when the primary asks it to, and
	// keeps against retention what is not there yet (archive.go); a
	// refill copies from it what no peer holds (refill_archive.go).
	Archive ArchiveOptions

	// Join is --join: once serving, a log store the primary's membership
	// does not name (as a log store, joining or learning) asks the
	// primary for add_logstore Advertise, and again until it is named
	// (membership.go). Nodes are the data nodes it asks (the primary is
	// among them; the others refuse at once).
	Join      bool
	Advertise string
	Nodes     []string
	// Leaving, if set, says when the log store is told to stop whether it
	// is going away for good (a StatefulSet scaled down,
	// --leave-on-scale-down: internal/kube Client.ScaledDown): it then
	// asks the primary for remove_logstore Advertise, within LeaveTimeout
	// (0: DefaultLeaveTimeout), while it still serves (the change's joint
	// record may need its acknowledgement). Any other stop keeps it a
	// log store of the contract.
	Leaving      func(context.Context) (down bool, why string, err error)
	LeaveTimeout time.Duration

	// Now is the clock retention by age compares commit times with; nil
	// means time.Now.
	Now func() time.Time
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Registry receives the log store's metrics; nil means a private registry.
	Registry *prometheus.Registry
	// StopTimeout bounds the graceful stop.
	StopTimeout time.Duration
}

// Defaults and bounds.
const (
	DefaultSegmentBytes    = 64 << 20
	DefaultRetentionBytes  = 1 << 30
	DefaultMaxMessageBytes = 64 << 20
	// MinSegmentBytes is the smallest segment size accepted. Small segments
	// only cost files; tests use them to exercise retention.
	MinSegmentBytes = 4 << 10
)

// edgeMessageBytes bounds a request from a peer that is not a data node
// (a log store refilling, an admin's verify or restore, Status): they are
// a few hundred bytes, and a peer must not make the log store hold
// MaxMessageBytes per call for them (internal/serve's edge transport,
// under TLS and the default policy).
const edgeMessageBytes = 1 << 20

// DefaultConfig returns a Config with every default filled in; callers set
// DataDir (and usually the addresses).
func DefaultConfig() Config {
	return Config{
		Listen:          "127.0.0.1:7400",
		MetricsListen:   "127.0.0.1:9400",
		SegmentBytes:    DefaultSegmentBytes,
		RetentionBytes:  DefaultRetentionBytes,
		MaxMessageBytes: DefaultMaxMessageBytes,
		FlushDelay:      5 * time.Millisecond,
		StopTimeout:     30 * time.Second,
	}
}

// Validate reports every invalid setting, naming its flag.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir: required"))
	}
	if c.FlushDelay < 0 || c.FlushDelay > time.Second {
		errs = append(errs, fmt.Errorf("--flush-delay: %v is not in [0, 1s]", c.FlushDelay))
	}
	if c.Listen == "" {
		errs = append(errs, errors.New("--listen: required"))
	}
	if c.SegmentBytes < MinSegmentBytes {
		errs = append(errs, fmt.Errorf("--segment-bytes: %d is below %d", c.SegmentBytes, MinSegmentBytes))
	}
	if c.RetentionBytes < 0 {
		errs = append(errs, fmt.Errorf("--retention-bytes: %d is negative (0 keeps everything)", c.RetentionBytes))
	}
	if c.RetentionAge < 0 {
		errs = append(errs, fmt.Errorf("--retention-age: %v is negative (0 keeps everything)", c.RetentionAge))
	}
	if c.MaxMessageBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("max message bytes: %d is below 1MiB", c.MaxMessageBytes))
	}
	seen := map[string]bool{}
	for i, p := range c.Peers {
		switch {
		case p == "":
			errs = append(errs, fmt.Errorf("--peers: entry %d is empty", i))
		case seen[p]:
			errs = append(errs, fmt.Errorf("--peers: %s is listed twice", p))
		}
		seen[p] = true
	}
	if err := c.Archive.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Join || c.Leaving != nil {
		what := "--join"
		if !c.Join {
			what = "--leave-on-scale-down"
		}
		if c.Advertise == "" {
			errs = append(errs, fmt.Errorf("--advertise: required with %s: the address the data nodes reach this log store at, as the contract names it", what))
		} else if strings.ContainsAny(c.Advertise, " \t\n,") {
			errs = append(errs, fmt.Errorf("--advertise: %q is not one address (host:port)", c.Advertise))
		}
		if len(c.Nodes) == 0 {
			errs = append(errs, fmt.Errorf("--nodes: required with %s: the data nodes to ask for the primary", what))
		}
		for i, n := range c.Nodes {
			if n == "" {
				errs = append(errs, fmt.Errorf("--nodes: entry %d is empty", i))
			}
		}
	}
	if c.LeaveTimeout < 0 {
		errs = append(errs, fmt.Errorf("--leave-timeout: %v is negative", c.LeaveTimeout))
	}
	if c.StopTimeout < 0 {
		errs = append(errs, fmt.Errorf("stop timeout: %v is negative", c.StopTimeout))
	}
	return errors.Join(errs...)
}
