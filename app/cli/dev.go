package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
)

func devFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var (
		dataDir   string
		replicas  int
		basePort  int
		host      string
		pol       = primary.DefaultPolicy()
		keep      bool
		logstores = 1
		auto      = true
	)
	fs.StringVar(&dataDir, "data-dir", "", "root directory for every node's data (default: a new temporary directory, removed on exit)")
	fs.IntVar(&replicas, "replicas", 2, "number of replicas")
	fs.IntVar(&logstores, "logstores", logstores, "number of log stores (3: a majority survives the loss of one; each refills from the others)")
	fs.IntVar(&basePort, "base-port", 7400, "first log store at this port, primary at +1, replicas from +2, further log stores after them; metrics at the same ports +2000")
	fs.StringVar(&host, "host", "127.0.0.1", "address every node listens on")
	fs.BoolVar(&auto, "auto-failover", auto, "fail over by itself when the primary dies (the log stores hold the election, as walship node --auto-failover); false: kill -USR1 leaves promoting a replica to you")
	fs.BoolVar(&keep, "keep", false, "keep the temporary data directory on exit")
	durabilityFlag(fs, &pol.Durability)
	replicationFlag(fs, &pol.Replication)
	fs.IntVar(&pol.SyncReplicas, "sync-replicas", pol.SyncReplicas, "k in 'any k replicas' for --replication sync")
	syncLevelFlag(fs, &pol.SyncLevel)
	var withTLS, plaintext bool
	fs.BoolVar(&withTLS, "tls", false, "serve mTLS with a throwaway CA and certificates (in DATA_DIR/tls) for the nodes, a client and an admin")
	maxAge := time.Hour
	fs.DurationVar(&maxAge, "max-connection-age", maxAge, "with --tls, close connections this old so they re-handshake (streams resume); 0 = never")
	fs.BoolVar(&plaintext, "plaintext", false, "serve without TLS on a non-loopback --host: anyone who reaches the ports can read the log and write (loopback needs no flag)")
	// Every log store gets the archive; the primary has one of them upload.
	var arch archive.Config
	addArchiveFlags(fs, &arch)
	return func(ctx context.Context) error {
		if logstores < 1 {
			return fmt.Errorf("--logstores: %d, want at least 1 (the quorum of the epoch vote)", logstores)
		}
		if maxAge < 0 {
			return fmt.Errorf("--max-connection-age: %v is negative (0 = never)", maxAge)
		}
		if err := devTransport(env, host, withTLS, plaintext); err != nil {
			return err
		}
		if err := arch.Validate(); err != nil {
			return usageErr(env, "%v", err)
		}
		if dataDir == "" {
			d, err := os.MkdirTemp("", "walship-dev-")
			if err != nil {
				return err
			}
			dataDir = d
			if !keep {
				defer os.RemoveAll(d)
			}
		}
		var sec serve.Security
		var tlsDir string
		if withTLS {
			tlsDir = filepath.Join(dataDir, "tls")
			var err error
			if sec, err = cluster.DevTLS(tlsDir, host); err != nil {
				return fmt.Errorf("--tls: %w", err)
			}
			sec.MaxConnectionAge = maxAge
		}
		c, err := cluster.Start(ctx, cluster.Config{
			Dir: dataDir, LogStores: logstores, Replicas: replicas, Host: host, BasePort: basePort, Metrics: true, Failover: true, AutoFailover: auto,
			Primary:  func(cfg *primary.Config) { cfg.Policy = pol },
			LogStore: func(_ int, cfg *logstore.Config) { cfg.Archive.Config = arch },
			// Data nodes read it: a replica no one else can serve re-seeds from it.
			Replica:  func(_ int, cfg *replica.Config) { cfg.Archive = arch },
			Logger:   env.Logger,
			Security: sec,
		})
		if err != nil {
			return err
		}
		// SIGUSR1 stops whichever data node is the primary, as if its
		// machine died: a replica promotes itself (or, without
		// --auto-failover, is promoted by hand). SIGUSR2 starts the
		// stopped nodes again. Caught before the banner that tells of
		// them: a signal sent as soon as it shows must not end the process.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
		defer signal.Stop(sigs)
		clusterID, putLSN := "-", uint64(0)
		if st, err := c.Status(ctx, c.Primary); err == nil {
			if st.GetClusterId() != "" {
				clusterID = st.GetClusterId()
			}
			// The LSN the printed Put will return, if it is the next
			// write: a Put is two records, the put and its commit.
			putLSN = st.GetLastLsn() + 2
		}
		printDev(env, c, dataDir, tlsDir, clusterID, putLSN, auto)
		if arch.Set() {
			printDevArchive(env, c, dataDir, host, basePort, arch)
		}
		for {
			select {
			case sig := <-sigs:
				if sig == syscall.SIGUSR1 {
					devStopPrimary(env, c, auto)
				} else {
					devRestart(ctx, env, c)
				}
				continue
			case <-ctx.Done():
			}
			break
		}
		fmt.Fprintln(env.Stdout, "\nstopping the cluster...")
		return c.Stop()
	}
}

// devStopPrimary stops the data node that is the primary (SIGUSR1) and
// prints how to watch the automatic failover, or the promotion of a
// replica that still runs.
func devStopPrimary(env *Env, c *cluster.Cluster, auto bool) {
	// The primary of the newest epoch: one a switchover or a promotion
	// replaced may not have stepped down yet.
	var stopped *cluster.Node
	var epoch uint64
	for _, n := range devDataNodes(c) {
		if dn := n.DataNode(); !n.Stopped() && dn != nil {
			if p := dn.Primary(); p != nil && (stopped == nil || p.Epoch() > epoch) {
				stopped, epoch = n, p.Epoch()
			}
		}
	}
	if stopped == nil {
		fmt.Fprintf(env.Stdout, "\nno data node is the primary now: nothing to stop (kill -USR2 %d starts the stopped nodes again)\n", os.Getpid())
		return
	}
	var live *cluster.Node
	for _, n := range devDataNodes(c) {
		if n != stopped && !n.Stopped() && n.DataNode() != nil {
			live = n
			break
		}
	}
	fmt.Fprintf(env.Stdout, "\nstopping %s, the primary (as if its machine died)\n", stopped.Name)
	var addrs []string
	for _, n := range c.Nodes() {
		addrs = append(addrs, n.Addr)
	}
	switch {
	case live == nil:
		fmt.Fprintf(env.Stdout, "no replica runs to take over; start the stopped nodes again:\n  kill -USR2 %d\n", os.Getpid())
	case auto:
		fmt.Fprintf(env.Stdout, "failover is automatic: once the log stores stop hearing it (about a second), the most advanced replica promotes itself. Watch it (ELECTION shows each node's view):\n  walship ctl status --nodes %s\nthen start %s again (it rejoins as a replica):\n  kill -USR2 %d\n",
			strings.Join(addrs, ","), stopped.Name, os.Getpid())
	default:
		fmt.Fprintf(env.Stdout, "promote a replica that runs, e.g. %s:\n  walship ctl promote --node %s\nthen start %s again (it rejoins as a replica):\n  kill -USR2 %d\n",
			live.Name, live.Addr, stopped.Name, os.Getpid())
	}
	if err := c.StopNode(stopped); err != nil {
		env.Logger.Warn("stopping the primary", "node", stopped.Name, "err", err)
	}
	fmt.Fprintf(env.Stdout, "%s stopped\n", stopped.Name)
}

// devRestart starts the stopped nodes again (SIGUSR2).
func devRestart(ctx context.Context, env *Env, c *cluster.Cluster) {
	started, err := c.RestartStopped(ctx)
	for _, n := range started {
		role := "a log store"
		if dn := n.DataNode(); dn != nil {
			role = "the " + dn.Role().String()
		}
		fmt.Fprintf(env.Stdout, "\nstarted %s again at %s: %s\n", n.Name, n.Addr, role)
	}
	if err != nil {
		fmt.Fprintf(env.Stdout, "\ncould not start every stopped node: %v\n", err)
	}
	if len(started) == 0 && err == nil {
		fmt.Fprintln(env.Stdout, "\nno node is stopped: nothing to start")
	}
}

// devDataNodes are the cluster's data nodes, the first primary first.
func devDataNodes(c *cluster.Cluster) []*cluster.Node {
	return append([]*cluster.Node{c.Primary}, c.Replicas...)
}

// devTransport refuses to serve plaintext beyond loopback unless
// --plaintext asks for it, as every other command does (and says so in
// the log when it does).
func devTransport(env *Env, host string, withTLS, plaintext bool) error {
	switch {
	case withTLS && plaintext:
		return errors.New("--plaintext: not with --tls")
	case !withTLS && !plaintext && !loopback(net.JoinHostPort(host, "0")):
		return fmt.Errorf("--host %s: serving plaintext beyond loopback needs --plaintext (or --tls)", host)
	case !withTLS:
		env.Logger.Warn("serving plaintext: no TLS, no authentication, no authorization; anyone who reaches the ports can read the log and write", "host", host)
	}
	return nil
}

func printDev(env *Env, c *cluster.Cluster, dataDir, tlsDir, clusterID string, putLSN uint64, auto bool) {
	w := env.Stdout
	fmt.Fprintf(w, "\nwalship dev cluster is up (data in %s). Ctrl-C stops it.\n", dataDir)
	fmt.Fprintf(w, "Cluster id %s: stamped in every node's DATA_DIR/cluster; a node of another cluster is refused.\n\n", clusterID)
	fmt.Fprintf(w, "  %-10s %-22s %s\n", "node", "gRPC", "metrics")
	for _, n := range c.Nodes() {
		fmt.Fprintf(w, "  %-10s %-22s http://%s/metrics\n", n.Name, n.Addr, n.MetricsAddr)
	}
	p := c.Primary.Addr
	var addrs []string
	for _, n := range c.Nodes() {
		addrs = append(addrs, n.Addr)
	}
	r, promote := p, p
	if len(c.Replicas) > 0 {
		r = c.Replicas[0].Addr
		// The switchover below hands the role to replica-0, which
		// kill -USR1 then stops: promote another one.
		promote = c.Replicas[len(c.Replicas)-1].Addr
	}
	g := "-plaintext"
	if tlsDir != "" {
		// The admin may call everything; a client only KVService (and Status).
		g = "$G"
		fmt.Fprintf(w, `
mTLS on every port (trust domain %[2]s); certificates in %[1]s: node.crt
(the nodes), client.crt (KVService and Status), admin.crt (everything),
ca.crt (the CA). walship ctl and check read WALSHIP_TLS_*; grpcurl takes $G:

  export WALSHIP_TLS_CA=%[1]s/ca.crt WALSHIP_TLS_CERT=%[1]s/admin.crt WALSHIP_TLS_KEY=%[1]s/admin.key
  G="-cacert %[1]s/ca.crt -cert %[1]s/admin.crt -key %[1]s/admin.key"
`, tlsDir, cluster.DevTrustDomain)
	}
	fmt.Fprintf(w, `
Try it (grpcurl needs no .proto files: every node serves reflection):

  grpcurl %[6]s %[1]s list
  grpcurl %[6]s -d '{"key":"hello","value":"d29ybGQ="}' %[1]s %[3]s/Put
  grpcurl %[6]s -d '{"key":"hello","min_lsn":"%[7]d"}' %[2]s %[3]s/Get      # %[7]d: the LSN the Put returned
  grpcurl %[6]s -d '{"key":"hello","policy":{"replication":"REPLICATION_MODE_SYNC","sync_replicas":2,"sync_level":"SYNC_LEVEL_APPLY"}}' %[1]s %[3]s/Put
  grpcurl %[6]s %[1]s walship.v1.AdminService/Status
  grpcurl %[6]s %[2]s walship.v1.AdminService/Status

Fail over (the nodes are members of one cluster; the log stores are the quorum):

  walship ctl status --nodes %[4]s
  walship ctl switchover --primary %[1]s --target replica-0     # planned: nothing lost
%[9]s  kill -USR2 %[5]d                                          # start the stopped node again: it rejoins as a replica

Check that it is linearizable (a bounded workload of its own, checked with porcupine):

  walship check linear --primary %[1]s --replica %[2]s --duration 10s

`, p, r, walshipv1.KVService_ServiceDesc.ServiceName, strings.Join(addrs, ","), os.Getpid(), g, putLSN, promote, devFailoverLines(auto, promote, strings.Join(addrs, ","), strings.Join(c.LogStoreAddrs(), ",")))
}

// devFailoverLines are printDev's lines between the switchover and the
// restart: what to do once the primary died.
func devFailoverLines(auto bool, promote, nodes, logstores string) string {
	pid := os.Getpid()
	if auto {
		return fmt.Sprintf(`  kill -USR1 %[1]d                                          # stop the primary, as if its machine died: a replica promotes itself
  walship ctl status --nodes %[2]s    # watch it: ELECTION says who holds it and why each node contends or not
  walship ctl failover pause --logstores %[3]s    # for maintenance: no automatic failover until resume
  walship ctl failover resume --logstores %[3]s
`, pid, nodes, logstores)
	}
	return fmt.Sprintf(`  kill -USR1 %[1]d                                          # stop the primary, as if its machine died
  walship ctl promote --node %[2]s --dry-run                    # what a promotion would see and risk
  walship ctl promote --node %[2]s
`, pid, promote)
}

// printDevArchive says where the dev cluster archives and how to check
// and restore from it: the commands as a user would type them, with the
// archive's flags.
func printDevArchive(env *Env, c *cluster.Cluster, dataDir, host string, basePort int, arch archive.Config) {
	flags := archiveArgs(arch)
	var addrs []string
	for _, n := range c.Nodes() {
		addrs = append(addrs, n.Addr)
	}
	// Beside the dev cluster's directory, so that it outlives it.
	restored := dataDir + "-restored"
	roPort := 0
	if basePort != 0 {
		roPort = basePort + 100
	}
	creds := ""
	if strings.HasPrefix(arch.URL, "s3:") {
		creds = "Credentials come from the AWS SDK's chain (AWS_ACCESS_KEY_ID and\nAWS_SECRET_ACCESS_KEY, or AWS_PROFILE). "
	}
	fmt.Fprintf(env.Stdout, `Archive: every log store has %[1]s; the primary has one of them
upload what a majority of the log stores holds. A new dev cluster (a new
--data-dir) is another cluster: give it its own --archive, or its log stores
refuse to upload. %[6]sA restore needs nothing but the archive:

  walship ctl status --nodes %[2]s     # ARCHIVED column, archive lag and uploader
  walship ctl verify %[3]s
  walship restore %[3]s --latest --data-dir %[4]s
  walship replica --read-only --id restored --data-dir %[4]s --listen %[5]s --metrics-listen ''

`, arch.URL, strings.Join(addrs, ","), flags, shellQuote(restored), net.JoinHostPort(host, strconv.Itoa(roPort)), creds)
}

// archiveArgs are the command-line flags that reach the archive a.
func archiveArgs(a archive.Config) string {
	args := []string{"--archive", shellQuote(a.URL)}
	if a.Endpoint != "" {
		args = append(args, "--archive-endpoint", shellQuote(a.Endpoint))
	}
	if a.Region != "" {
		args = append(args, "--archive-region", shellQuote(a.Region))
	}
	if a.PathStyle {
		args = append(args, "--archive-path-style")
	}
	if a.CAFile != "" {
		args = append(args, "--archive-ca-file", shellQuote(a.CAFile))
	}
	if a.KeyFile != "" {
		args = append(args, "--archive-key-file", shellQuote(a.KeyFile))
	}
	if a.Timeout != archive.DefaultTimeout {
		args = append(args, "--archive-timeout", a.Timeout.String())
	}
	return strings.Join(args, " ")
}

// shellQuote quotes s for a POSIX shell if it needs it.
func shellQuote(s string) string {
	safe := s != ""
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
