package cli

import (
	"context"
	"flag"

	"github.com/walship/walship/services/primary"
)

func primaryFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	cfg := primary.DefaultConfig()
	cfg.Listen = ":7401"
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "gRPC listen address")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", ":9401", "HTTP listen address for /metrics (empty disables)")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for the WAL and snapshots (required)")
	durabilityFlag(fs, &cfg.Policy.Durability)
	fs.DurationVar(&cfg.AsyncFlushInterval, "async-flush-interval", cfg.AsyncFlushInterval, "longest time an async-durability commit stays unsynced (what a crash can lose)")
	replicationFlag(fs, &cfg.Policy.Replication)
	fs.IntVar(&cfg.Policy.SyncReplicas, "sync-replicas", cfg.Policy.SyncReplicas, "k in 'any k replicas' for --replication sync")
	syncLevelFlag(fs, &cfg.Policy.SyncLevel)
	fs.DurationVar(&cfg.Policy.SyncTimeout, "sync-timeout", cfg.Policy.SyncTimeout, "how long a sync commit waits for replicas or log stores before failing with UNAVAILABLE")
	logstoreAckFlag(fs, &cfg.Policy.LogStore)
	fs.Int64Var(&cfg.SegmentBytes, "segment-bytes", cfg.SegmentBytes, "WAL segment size")
	fs.Int64Var(&cfg.SnapshotEveryBytes, "snapshot-every-bytes", cfg.SnapshotEveryBytes, "take a state snapshot after this many WAL bytes, or after as many as the last snapshot had if that is more")
	fs.IntVar(&cfg.MaxValueBytes, "max-value-bytes", cfg.MaxValueBytes, "largest value accepted")
	fs.IntVar(&cfg.MaxTxnOps, "max-txn-ops", cfg.MaxTxnOps, "most ops in one Txn")
	fs.Var(codecFlag{&cfg.Codec}, "codec", "WAL batch codec: msgpack or json")
	fs.Var(listFlag{&cfg.LogStores}, "logstore", "log store addresses to ship the WAL to, comma-separated")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cfg.HeartbeatInterval, "heartbeat period on idle replication and log store streams")
	fs.DurationVar(&cfg.ReplicaTimeout, "replica-timeout", 0, "end a replica stream silent this long (0 = 10 heartbeat intervals)")
	fs.Int64Var(&cfg.WALRetentionBytes, "wal-retention-bytes", cfg.WALRetentionBytes, "keep at most this much WAL for replicas (past it they catch up from a log store or a snapshot)")
	fs.Int64Var(&cfg.MaxReplicaLagBytes, "max-replica-lag-bytes", cfg.MaxReplicaLagBytes, "cut off a replica stream this far behind (0 = never); it catches up from a log store")
	return func(ctx context.Context) error {
		cfg.Logger = env.Logger.With("service", "primary")
		cfg.Registry = newRegistry()
		p, err := primary.New(cfg)
		if err != nil {
			return err
		}
		return p.Run(ctx)
	}
}
