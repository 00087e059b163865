package cli

import (
	"context"
	"flag"

	"github.com/walship/walship/services/logstore"
)

func logstoreFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	cfg := logstore.DefaultConfig()
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "gRPC listen address")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", cfg.MetricsListen, metricsListenHelp)
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for the WAL and the epoch file (required)")
	fs.Int64Var(&cfg.RetentionBytes, "retention-bytes", cfg.RetentionBytes, "keep at most this many WAL bytes, removing whole old segments (0 = unlimited)")
	fs.DurationVar(&cfg.RetentionAge, "retention-age", cfg.RetentionAge, "remove segments whose newest batch was committed longer ago than this (0 = unlimited)")
	fs.Int64Var(&cfg.SegmentBytes, "segment-bytes", cfg.SegmentBytes, "WAL segment size: the unit retention removes")
	fs.DurationVar(&cfg.FlushDelay, "flush-delay", cfg.FlushDelay, "space write rounds (one fsync each) this far apart while no commit waits on the log store (0 = fsync every arrival)")
	fs.Var(listFlag{&cfg.Peers}, "peers", "the cluster's log stores, comma-separated (this one may be among them): an empty log store, or one whose primary no longer has what follows its log, refills from them (and from --archive what they no longer hold)")
	addArchiveUploadFlags(fs, &cfg.Archive)
	sf := addSecurityFlags(fs, true)
	return func(ctx context.Context) error {
		cfg.Logger = env.Logger.With("service", "logstore")
		cfg.Registry = newRegistry()
		sec, err := sf.serve(ctx, cfg.Logger, cfg.Listen, cfg.MetricsListen)
		if err != nil {
			return err
		}
		cfg.Security = sec
		s, err := logstore.New(cfg)
		if err != nil {
			return err
		}
		return s.Run(ctx)
	}
}
