package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/freeport"
	"github.com/walship/walship/internal/restore"
	"github.com/walship/walship/services/primary"
)

// walship restore: point-in-time recovery from the log stores or from the
// archive (internal/restore), into a new data directory.

func restoreFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var (
		logstores []string
		dataDir   string
		lsn       uint64
		at        string
		latest    bool
		dryRun    bool
		clusterID string
	)
	var arch archive.Config
	nc := addNewClusterFlags(fs)
	fs.Var(listFlag{&logstores}, "logstore", "gRPC addresses of the log stores to restore from, comma-separated (or --archive)")
	addArchiveFlags(fs, &arch)
	fs.StringVar(&dataDir, "data-dir", "", "the data directory to build; it must not exist or be empty (required unless --dry-run)")
	fs.Uint64Var(&lsn, "lsn", 0, "restore to exactly this LSN (a commit's LSN)")
	fs.StringVar(&at, "time", "", "restore to the last commit at or before this time (RFC 3339, e.g. 2026-12-03T14:02:00Z)")
	fs.BoolVar(&latest, "latest", false, "restore to the newest LSN a majority of the given log stores hold, or the newest the archive holds")
	fs.BoolVar(&dryRun, "dry-run", false, "resolve and check the restore (target, snapshot, lineage, every batch's CRC) without writing anything")
	fs.StringVar(&clusterID, "cluster-id", "", "refuse log stores of any other cluster than this one")
	sf := addSecurityFlags(fs, false)
	return func(ctx context.Context) error {
		d, err := sf.dial(ctx, env.Logger)
		if err != nil {
			return err
		}
		var target restore.Target
		n := 0
		if isSet(fs, "lsn") {
			target, n = restore.AtLSN(lsn), n+1
		}
		if at != "" {
			t, err := time.Parse(time.RFC3339Nano, at)
			if err != nil {
				return usageErr(env, "--time: %q is not an RFC 3339 time (e.g. 2026-12-03T14:02:00Z): %v", at, err)
			}
			target, n = restore.AtTime(t), n+1
		}
		if latest {
			target, n = restore.AtLatest(), n+1
		}
		if n != 1 {
			return usageErr(env, "give exactly one of --lsn, --time and --latest")
		}
		if len(logstores) == 0 && !arch.Set() {
			return usageErr(env, "--logstore or --archive: say where to restore from")
		}
		if len(logstores) > 0 && arch.Set() {
			return usageErr(env, "--logstore and --archive: restore from one or the other")
		}
		var a *archive.Archive
		if arch.Set() {
			var err error
			if a, err = archive.Open(ctx, arch, env.Logger); err != nil {
				return err
			}
		}
		if dataDir == "" && !dryRun {
			return usageErr(env, "--data-dir: required (or --dry-run)")
		}
		newCluster, err := nc.newCluster(fs)
		if err != nil {
			return usageErr(env, "%v", err)
		}
		opts := restore.Options{LogStores: logstores, Archive: a, DataDir: dataDir, Target: target, DryRun: dryRun,
			ClusterID: clusterID, NewCluster: newCluster, Dialer: d, Logger: env.Logger}
		var next restoredNext
		if newCluster == nil && !dryRun {
			// The printed primary is a new cluster of one: if the restored
			// record names other members (or a run-time change set them),
			// the restore writes that cluster's first epoch, else a primary
			// without --peers refuses the log.
			next = pickRestoredNext(dataDir)
			pc := primary.DefaultConfig()
			opts.NewClusterIfChanged = &restore.NewCluster{Primary: next.id,
				Contract: primary.ContractOf(pc.Policy, []primary.Member{{ID: next.id, Addr: next.listen}}, nil, pc.LeaseTimeout)}
		}
		res, err := restore.Run(ctx, opts)
		if err != nil {
			return err
		}
		printRestore(env, res, dryRun, dataDir)
		if newCluster != nil && !dryRun {
			nc.printNext(env.Stdout, dataDir)
		} else if !dryRun {
			next.print(env.Stdout, res.NewEpoch != 0)
		}
		return nil
	}
}

// isSet reports whether the flag was given on the command line or in the
// environment (Parse sets environment fallbacks as flags).
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func printRestore(env *Env, res *restore.Result, dryRun bool, dataDir string) {
	at := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	w := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "target\t%s\n", res.Target)
	fmt.Fprintf(w, "resolved LSN\t%d\n", res.LSN)
	fmt.Fprintf(w, "commit time\t%s\n", at(res.CommitTime))
	if sn := res.Snapshot; sn != nil {
		fmt.Fprintf(w, "snapshot\tLSN %d (epoch %d, %s, %d keys, %d bytes) from %s\n", sn.GetLsn(), sn.GetEpoch(),
			at(time.Unix(0, sn.GetCommitTimeUnixNano())), sn.GetKeys(), sn.GetBytes(), res.SnapshotFrom)
	} else {
		fmt.Fprintf(w, "snapshot\tnone: replay from LSN 1\n")
	}
	from := res.BatchesFrom
	if from == "" {
		from = "-"
	}
	fmt.Fprintf(w, "replay\t%d batches, %d bytes from %s\n", res.Batches, res.Bytes, from)
	var lineage []string
	for _, s := range res.Lineage {
		lineage = append(lineage, fmt.Sprintf("epoch %d from LSN %d", s.Epoch, s.FirstLSN))
	}
	fmt.Fprintf(w, "lineage\t%s\n", strings.Join(lineage, ", "))
	for _, s := range res.Sources {
		if s.Err != nil {
			fmt.Fprintf(w, "log store %s\tno answer: %v\n", s.Addr, s.Err)
			continue
		}
		fmt.Fprintf(w, "log store %s\tLSNs %d..%d, %d snapshots, promised epoch %d\n", s.Addr, s.FirstLSN, s.Usable, len(s.Snapshots), s.VoteEpoch)
	}
	if dryRun {
		fmt.Fprintf(w, "dry run\tnothing written\n")
		_ = w.Flush()
		return
	}
	fmt.Fprintf(w, "restored\tLSN %d, %d keys, state digest %s\n", res.LSN, res.Keys, res.Digest)
	fmt.Fprintf(w, "took\t%v (replay %v, %.1f MB/s)\n", res.Took.Round(time.Millisecond), res.Replayed.Round(time.Millisecond), res.ReplayMBps())
	fmt.Fprintf(w, "data dir\t%s, new cluster %s\n", dataDir, res.ClusterID)
	if res.NewEpoch != 0 {
		fmt.Fprintf(w, "first epoch\t%d, its epoch record at LSNs %d..%d: the directory is at LSN %d\n", res.NewEpoch, res.LSN+1, res.NewEpochLSN, res.NewEpochLSN)
	}
	_ = w.Flush()
}

// restoredNext is how the commands printed after a restore without
// --members start the restored directory.
type restoredNext struct {
	dataDir, id, listen, metrics string
}

// pickRestoredNext picks them, runnable as printed beside whatever else
// runs here (walship dev's nodes take 7400.. and 9400..): an id, and free
// gRPC and metrics ports on loopback, the first pair from 7409 and 9409
// on.
func pickRestoredNext(dataDir string) restoredNext {
	id := filepath.Base(dataDir)
	if !validNodeID(id) {
		id = "restored"
	}
	listen, metrics := freePair("127.0.0.1", 7409, 9409, 90)
	return restoredNext{dataDir: dataDir, id: id, listen: listen, metrics: metrics}
}

// print prints the commands; newCluster says the restore wrote the first
// epoch of the printed primary's cluster.
func (n restoredNext) print(w io.Writer, newCluster bool) {
	args := fmt.Sprintf("--id %s --data-dir %s --listen %s --metrics-listen %s", n.id, shellQuote(n.dataDir), n.listen, n.metrics)
	fmt.Fprintf(w, "\nStart it as a read-only node (Get and Scan of the restored state; no writes):\n  walship replica --read-only %s\n", args)
	fmt.Fprintf(w, "or as the primary of a new cluster, taking writes from the restored state on:\n  walship primary %s\n", args)
	if newCluster {
		fmt.Fprintf(w, "(the restored log names the old cluster's members: the restore wrote the first epoch of %s's new cluster of one, "+
			"so that it starts as printed; restore with --members for another cluster)\n", n.id)
	}
}

// validNodeID reports whether id is a valid --id: 1..64 of [A-Za-z0-9._-].
func validNodeID(id string) bool {
	if id == "" || len(id) > 64 || id == "." || id == ".." {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-", r)) {
			return false
		}
	}
	return true
}

// freePorts returns n distinct addresses host:port, the first ports from
// `from` on (at most tries of them) that nothing listens on, then ports
// freeport picks.
func freePorts(host string, from, tries, n int) []string {
	var out []string
	for port := from; port < from+tries && len(out) < n; port++ {
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			continue
		}
		if l.Close() == nil {
			out = append(out, net.JoinHostPort(host, strconv.Itoa(port)))
		}
	}
	for len(out) < n {
		a, err := freeport.Pick(host)
		if err != nil {
			a = net.JoinHostPort(host, strconv.Itoa(from))
		}
		out = append(out, a)
	}
	return out
}

// freePair returns host:a and host:b, the first pair of ports a, b =
// grpcFrom+i, metricsFrom+i (i < n) that nothing listens on, so that a
// printed command is predictable and yet runs; else two ports freeport
// picks.
func freePair(host string, grpcFrom, metricsFrom, n int) (string, string) {
	free := func(port int) bool {
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return false
		}
		return l.Close() == nil
	}
	for i := range n {
		if free(grpcFrom+i) && free(metricsFrom+i) {
			return net.JoinHostPort(host, strconv.Itoa(grpcFrom+i)), net.JoinHostPort(host, strconv.Itoa(metricsFrom+i))
		}
	}
	a, errA := freeport.Pick(host)
	b, errB := freeport.Pick(host)
	if errA != nil || errB != nil {
		// Nothing better to offer than the first pair, taken or not.
		return net.JoinHostPort(host, strconv.Itoa(grpcFrom)), net.JoinHostPort(host, strconv.Itoa(metricsFrom))
	}
	return a, b
}

// newClusterFlags are walship restore's --members and the contract flags
// that go with it: the new cluster the restored directory starts, whose
// first epoch the restore writes (restore.NewCluster). They are the new
// primary's own flags, so that the contract the restore writes is the one
// that primary states.
type newClusterFlags struct {
	members   peersFlag
	logstores []string
	policy    primary.Policy
	lease     time.Duration
}

// contractFlags are the flags that need --members.
var contractFlags = []string{"new-logstore", "replication", "sync-replicas", "sync-level", "logstore-ack", "lease-timeout"}

func addNewClusterFlags(fs *flag.FlagSet) *newClusterFlags {
	f := &newClusterFlags{policy: primary.DefaultPolicy(), lease: primary.DefaultLeaseTimeout}
	fs.Var(&f.members, "members", "start the restored directory as the first epoch of a new cluster of these data nodes, as id=address,... "+
		"(the new primary's --peers), the primary first: the restore writes that cluster's contract after the restored state, so that its primary "+
		"opens without waiting for the old cluster's members (give the new primary the same --peers, --logstore, --replication, --sync-replicas, "+
		"--sync-level, --logstore-ack and --lease-timeout)")
	fs.Var(listFlag{&f.logstores}, "new-logstore", "with --members: the new cluster's log stores, comma-separated (the new primary's --logstore; not the ones restored from)")
	replicationFlag(fs, &f.policy.Replication)
	fs.IntVar(&f.policy.SyncReplicas, "sync-replicas", f.policy.SyncReplicas, "with --members: the new primary's --sync-replicas (k in 'any k replicas' for --replication sync)")
	syncLevelFlag(fs, &f.policy.SyncLevel)
	logstoreAckFlag(fs, &f.policy.LogStore)
	fs.DurationVar(&f.lease, "lease-timeout", f.lease, "with --members: the new primary's --lease-timeout")
	// The primary's words for these flags would describe this command's
	// own waits: say whose they are.
	fs.Lookup("replication").Usage = "with --members: the new primary's --replication: disabled, async or sync"
	fs.Lookup("sync-level").Usage = "with --members: the new primary's --sync-level: write, flush or apply"
	fs.Lookup("logstore-ack").Usage = "with --members: the new primary's --logstore-ack: async, or sync (a majority of --new-logstore)"
	return f
}

// newCluster is the new cluster the flags name (nil without --members).
func (f *newClusterFlags) newCluster(fs *flag.FlagSet) (*restore.NewCluster, error) {
	if len(f.members.members) == 0 {
		for _, name := range contractFlags {
			if isSet(fs, name) {
				return nil, fmt.Errorf("--%s: only with --members (the new cluster's data nodes)", name)
			}
		}
		return nil, nil
	}
	if err := f.policy.Validate(); err != nil {
		return nil, fmt.Errorf("--members: the new primary's policy: %w", err)
	}
	if f.policy.LogStore == walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC && len(f.logstores) == 0 {
		return nil, errors.New("--logstore-ack sync: needs the new cluster's log stores (--new-logstore)")
	}
	return &restore.NewCluster{Primary: f.members.members[0].ID,
		Contract: primary.ContractOf(f.policy, f.members.members, f.logstores, f.lease)}, nil
}

// printNext prints how to start the new cluster: its primary on dataDir
// with the contract the restore wrote, and the other members as its
// replicas, each on an empty directory.
func (f *newClusterFlags) printNext(w io.Writer, dataDir string) {
	ms := f.members.members
	peers := shellQuote(f.members.String())
	contract := fmt.Sprintf("--peers %s", peers)
	if len(f.logstores) > 0 {
		contract += " --logstore " + shellQuote(strings.Join(f.logstores, ","))
	}
	// Metrics ports nothing listens on now, one per member, as
	// printRestoredNext's.
	ports := freePorts("127.0.0.1", 9409, 90, len(ms))
	metrics := func() string {
		m := ports[0]
		ports = ports[1:]
		return m
	}
	fmt.Fprintf(w, "\nStart the new cluster's primary with the contract the restore wrote (its first epoch), on new, empty log stores:\n")
	fmt.Fprintf(w, "  walship primary --id %s --data-dir %s --listen %s %s --replication %s --sync-replicas %d --sync-level %s --logstore-ack %s --lease-timeout %s --metrics-listen %s\n",
		ms[0].ID, shellQuote(dataDir), ms[0].Addr, contract, enumName(f.policy.Replication.String(), "REPLICATION_MODE_"), f.policy.SyncReplicas,
		enumName(f.policy.SyncLevel.String(), "SYNC_LEVEL_"), enumName(f.policy.LogStore.String(), "LOG_STORE_ACK_"), f.lease, metrics())
	if len(ms) > 1 {
		fmt.Fprintf(w, "and each other member as its replica, on an empty data directory:\n")
		for _, m := range ms[1:] {
			fmt.Fprintf(w, "  walship replica --id %s --data-dir EMPTY-DIR --listen %s %s --primary %s --metrics-listen %s\n", m.ID, m.Addr, contract, ms[0].Addr, metrics())
		}
	}
}

// enumName is a proto enum value's flag name: its name without prefix, in
// lower case.
func enumName(name, prefix string) string { return strings.ToLower(strings.TrimPrefix(name, prefix)) }
