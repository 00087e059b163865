package cli

import (
	"context"
	"flag"

	"github.com/walship/walship/services/replica"
)

func replicaFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	cfg := replica.DefaultConfig()
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "gRPC listen address")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", cfg.MetricsListen, "HTTP listen address for /metrics (empty disables)")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for the WAL and snapshots (required)")
	fs.StringVar(&cfg.ID, "id", "", "replica id, stable across restarts: 1..64 of [A-Za-z0-9._-] (required)")
	fs.StringVar(&cfg.Primary, "primary", "", "gRPC address of the primary to follow (required)")
	fs.StringVar(&cfg.LogStore, "logstore", "", "gRPC address of a log store to catch up from when the primary no longer has the needed LSN (optional)")
	fs.Int64Var(&cfg.SegmentBytes, "segment-bytes", cfg.SegmentBytes, "WAL segment size")
	fs.Int64Var(&cfg.SnapshotEveryBytes, "snapshot-every-bytes", cfg.SnapshotEveryBytes, "take a state snapshot (and truncate the WAL) after this many WAL bytes, or after as many as the last snapshot had if that is more")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cfg.HeartbeatInterval, "ack at least this often; no word from the primary for 3 intervals counts as cut off")
	fs.DurationVar(&cfg.FlushDelay, "flush-delay", cfg.FlushDelay, "longest a written batch waits for its fsync and apply while no sync commit waits on this replica (0 = every batch at once)")
	fs.Int64Var(&cfg.MaxUnappliedBytes, "max-unapplied-bytes", cfg.MaxUnappliedBytes, "memory for written batches waiting for the primary's durable LSN; beyond it they are read back from the WAL to be applied")
	return func(ctx context.Context) error {
		cfg.Logger = env.Logger.With("service", "replica", "id", cfg.ID)
		cfg.Registry = newRegistry()
		r, err := replica.New(cfg)
		if err != nil {
			return err
		}
		return r.Run(ctx)
	}
}
