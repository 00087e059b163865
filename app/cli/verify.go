package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/serve"
	"google.golang.org/grpc"
)

// walship ctl verify: check log stores' logs (LogStoreService.Verify) and
// the archive (internal/archive), and say what a restore from each can
// reach.

func ctlVerifyFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var (
		addrs   []string
		timeout time.Duration
	)
	var arch archive.Config
	var clusterID string
	fs.Var(listFlag{&addrs}, "logstore", "gRPC addresses of the log stores to check, comma-separated (or --archive)")
	addArchiveFlags(fs, &arch)
	fs.StringVar(&clusterID, "cluster-id", "", "with --archive: the cluster the archive must be of")
	fs.DurationVar(&timeout, "timeout", 30*time.Minute, "how long one log store may take to read its whole archive")
	sf := addSecurityFlags(fs, false)
	return func(ctx context.Context) error {
		d, err := sf.dial(ctx, env.Logger)
		if err != nil {
			return err
		}
		if len(addrs) == 0 && !arch.Set() {
			return usageErr(env, "--logstore or --archive: say what to check")
		}
		var failed []string
		if arch.Set() {
			a, err := archive.Open(ctx, arch, env.Logger)
			if err != nil {
				return err
			}
			vctx, cancel := context.WithTimeout(ctx, timeout)
			rep, err := a.Verify(vctx, clusterID, 8, "")
			cancel()
			if err != nil {
				return fmt.Errorf("verify the archive %s: %w", a, err)
			}
			if err := printArchiveVerify(env.Stdout, a.String(), rep); err != nil {
				return err
			}
			switch {
			case len(rep.Problems) > 0:
				failed = append(failed, fmt.Sprintf("%s: %d problems", a, len(rep.Problems)))
			case len(rep.Window.Ranges) == 0:
				failed = append(failed, a.String()+": nothing restorable")
			}
			if len(addrs) > 0 {
				fmt.Fprintln(env.Stdout)
			}
		}
		for i, addr := range addrs {
			if i > 0 {
				fmt.Fprintln(env.Stdout)
			}
			resp, err := serve.Call(ctx, d, addr, timeout, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.VerifyResponse, error) {
				return walshipv1.NewLogStoreServiceClient(cc).Verify(ctx, &walshipv1.VerifyRequest{})
			})
			if err != nil {
				fmt.Fprintf(env.Stdout, "log store %s: cannot verify: %v\n", addr, err)
				failed = append(failed, fmt.Sprintf("%s: %v", addr, err))
				continue
			}
			if err := printVerify(env.Stdout, addr, resp); err != nil {
				return err
			}
			switch {
			case len(resp.GetProblems()) > 0:
				failed = append(failed, fmt.Sprintf("%s: %d problems", addr, len(resp.GetProblems())))
			case resp.GetRestorableToLsn() == 0:
				failed = append(failed, addr+": nothing restorable")
			}
		}
		if len(failed) > 0 {
			return errors.New(strings.Join(failed, "; "))
		}
		return nil
	}
}

// printVerify prints one log store's Verify answer for an operator.
func printVerify(w io.Writer, addr string, r *walshipv1.VerifyResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "log store %s\n", addr)
	if r.GetFirstLsn() == 0 {
		fmt.Fprintf(tw, "  log\tempty\n")
	} else {
		fmt.Fprintf(tw, "  log\tLSNs %d..%d, %d batches, %s checked\n", r.GetFirstLsn(), r.GetLastLsn(), r.GetBatches(), byteSize(r.GetBytes()))
	}
	var epochs []string
	for _, e := range r.GetHistory() {
		epochs = append(epochs, fmt.Sprintf("%d from LSN %d", e.GetEpoch(), e.GetFirstLsn()))
	}
	if len(epochs) > 0 {
		fmt.Fprintf(tw, "  epochs\t%s\n", strings.Join(epochs, ", "))
	}
	if len(r.GetSnapshots()) == 0 {
		damaged := 0
		for _, p := range r.GetProblems() {
			if p.GetKind() == "snapshot" || strings.HasPrefix(p.GetMessage(), "snapshot file") {
				damaged++
			}
		}
		fmt.Fprintf(tw, "  snapshots\t%s\n", noSnapshots(damaged))
	}
	for i, s := range r.GetSnapshots() {
		label := ""
		if i == 0 {
			label = "snapshots"
		}
		fmt.Fprintf(tw, "  %s\tLSN %d, epoch %d, committed %s, %d keys, %s, digest %s\n", label, s.GetLsn(), s.GetEpoch(),
			commitTime(s.GetCommitTimeUnixNano()), s.GetKeys(), byteSize(s.GetBytes()), s.GetStateDigest())
	}
	if r.GetRestorableToLsn() == 0 {
		fmt.Fprintf(tw, "  restorable\tnothing (no intact snapshot, and the log does not start at LSN 1)\n")
	} else {
		fmt.Fprintf(tw, "  restorable\tLSNs %d..%d\n", r.GetRestorableFromLsn(), r.GetRestorableToLsn())
	}
	if len(r.GetProblems()) == 0 {
		fmt.Fprintf(tw, "  problems\tnone\n")
	} else {
		fmt.Fprintf(tw, "  problems\t%d\n", len(r.GetProblems()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.GetProblems()) == 0 {
		return nil
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "    KIND\tLSN\tWHAT")
	for _, p := range r.GetProblems() {
		fmt.Fprintf(tw, "    %s\t%d\t%s\n", p.GetKind(), p.GetLsn(), p.GetMessage())
	}
	return tw.Flush()
}

// printArchiveVerify prints an archive's Verify report for an operator.
func printArchiveVerify(w io.Writer, url string, r *archive.Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "archive %s\n", url)
	cluster := r.ClusterID
	if cluster == "" {
		cluster = "none (empty)"
	}
	fmt.Fprintf(tw, "  cluster\t%s\n", cluster)
	cat := r.Catalog
	fmt.Fprintf(tw, "  chunks\t%d (%d batches, %s of payload checked)\n", r.Chunks, r.Batches, byteSize(uint64(r.Bytes)))
	if cat != nil {
		var epochs []string
		for _, e := range cat.Lineage {
			epochs = append(epochs, fmt.Sprintf("%d from LSN %d", e.Epoch, e.FirstLSN))
		}
		if len(epochs) > 0 {
			fmt.Fprintf(tw, "  lineage\t%s\n", strings.Join(epochs, ", "))
		}
	}
	if len(r.Snapshots) == 0 {
		damaged := 0
		for _, p := range r.Problems {
			if p.Kind == "snapshot" || (cat != nil && isSnapshotObject(cat, p.Object)) {
				damaged++
			}
		}
		fmt.Fprintf(tw, "  snapshots\t%s\n", noSnapshots(damaged))
	}
	for i, s := range r.Snapshots {
		label := ""
		if i == 0 {
			label = "snapshots"
		}
		fmt.Fprintf(tw, "  %s\tLSN %d, epoch %d, committed %s, %d keys, %s, digest %s\n", label, s.LSN, s.Epoch,
			commitTime(s.Commit), s.Keys, byteSize(uint64(s.Size)), s.Digest)
	}
	if len(r.Window.Ranges) == 0 {
		fmt.Fprintf(tw, "  restorable\tnothing\n")
	}
	for i, rg := range r.Window.Ranges {
		label := ""
		if i == 0 {
			label = "restorable"
		}
		fmt.Fprintf(tw, "  %s\tLSNs %d..%d (%s .. %s)\n", label, rg.From, rg.To, timeOrDash(rg.FromTime), timeOrDash(rg.ToTime))
	}
	if n := len(r.Window.OutOfLineage) + len(r.Window.SnapshotsOutOfLineage); n > 0 {
		fmt.Fprintf(tw, "  outside the lineage\t%d objects (a tail a forced promotion cut: never restored)\n", n)
	}
	if cat != nil && len(cat.Unknown) > 0 {
		fmt.Fprintf(tw, "  not walship's\t%d objects under the prefix (ignored)\n", len(cat.Unknown))
	}
	if len(r.Problems) == 0 {
		fmt.Fprintf(tw, "  problems\tnone\n")
	} else {
		fmt.Fprintf(tw, "  problems\t%d\n", len(r.Problems))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Problems) == 0 {
		return nil
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "    KIND\tLSN\tOBJECT\tWHAT")
	for _, p := range r.Problems {
		obj := p.Object
		if obj == "" {
			obj = "-"
		}
		fmt.Fprintf(tw, "    %s\t%d\t%s\t%s\n", p.Kind, p.LSN, obj, p.Message)
	}
	return tw.Flush()
}

// noSnapshots says why no snapshot is listed: damaged ones (the problems
// name them), or none was ever stored — not a problem: a restore replays
// the log from its first LSN.
func noSnapshots(damaged int) string {
	if damaged > 0 {
		return fmt.Sprintf("none intact (%d damaged: see the problems)", damaged)
	}
	return "none stored yet"
}

// isSnapshotObject reports whether obj is one of the catalog's snapshots.
func isSnapshotObject(cat *archive.Catalog, obj string) bool {
	for _, sn := range cat.Snapshots {
		if obj != "" && archive.SnapshotName(sn) == obj {
			return true
		}
	}
	return false
}

func timeOrDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func commitTime(ns int64) string {
	if ns == 0 {
		return "at an unknown time"
	}
	return time.Unix(0, ns).UTC().Format(time.RFC3339)
}

// byteSize is n in the largest binary unit that keeps it at least 1.
func byteSize(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
