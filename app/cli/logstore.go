package cli

import (
	"context"
	"flag"
	"os"

	"github.com/walship/walship/internal/kube"
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
	fs.BoolVar(&cfg.Join, "join", false, "once serving, a log store the primary's contract does not name asks the primary to add it at --advertise (walship ctl members add --logstore: a learner until it has refilled and caught up), until the contract names it; one it names asks nothing (a StatefulSet scaled up, or its first log stores)")
	fs.StringVar(&cfg.Advertise, "advertise", "", "gRPC address the data nodes reach this log store at, as the contract names it (--join, --leave-on-scale-down)")
	fs.Var(listFlag{&cfg.Nodes}, "nodes", "the data nodes' gRPC addresses, comma-separated: where --join and --leave-on-scale-down find the primary")
	k := kube.Config{Pod: os.Getenv("POD_NAME"), Namespace: os.Getenv("POD_NAMESPACE")}
	var leave bool
	fs.BoolVar(&leave, "leave-on-scale-down", false, "a log store told to stop whose StatefulSet's spec.replicas leaves out its pod's ordinal asks the primary to remove it from the contract (walship ctl members remove --logstore), within --leave-timeout, serving until then; any other stop keeps it a log store of the contract")
	fs.DurationVar(&cfg.LeaveTimeout, "leave-timeout", logstore.DefaultLeaveTimeout, "how long a log store stopped for a scale-down (--leave-on-scale-down) tries to be removed before it stops anyway")
	fs.StringVar(&k.Pod, "pod-name", k.Pod, "this log store's Pod, of a StatefulSet, for --leave-on-scale-down (default $POD_NAME)")
	fs.StringVar(&k.Namespace, "pod-namespace", k.Namespace, "the namespace of the Pod and its StatefulSet, for --leave-on-scale-down (default $POD_NAMESPACE)")
	fs.StringVar(&k.Kubeconfig, "kubeconfig", "", "kubeconfig file for --leave-on-scale-down (default: the pod's service account)")
	sf := addSecurityFlags(fs, true)
	return func(ctx context.Context) error {
		cfg.Logger = env.Logger.With("service", "logstore")
		cfg.Registry = newRegistry()
		if leave {
			k.Logger = cfg.Logger
			c, err := kube.NewScaleDown(k)
			if err != nil {
				return err
			}
			cfg.Leaving = c.ScaledDown
		}
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
