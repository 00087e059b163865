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
	"github.com/walship/walship/internal/serve"
	"google.golang.org/grpc"
)

// walship ctl verify: check log stores' archives (LogStoreService.Verify)
// and say what a restore from each can reach.

func ctlVerifyFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var (
		addrs   []string
		timeout time.Duration
	)
	fs.Var(listFlag{&addrs}, "logstore", "gRPC addresses of the log stores to check, comma-separated (required)")
	fs.DurationVar(&timeout, "timeout", 30*time.Minute, "how long one log store may take to read its whole archive")
	sf := addSecurityFlags(fs, false)
	return func(ctx context.Context) error {
		if err := sf.dial(ctx, env.Logger); err != nil {
			return err
		}
		if len(addrs) == 0 {
			return usageErr(env, "--logstore: required")
		}
		var failed []string
		for i, addr := range addrs {
			if i > 0 {
				fmt.Fprintln(env.Stdout)
			}
			resp, err := serve.Call(ctx, addr, timeout, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.VerifyResponse, error) {
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
		fmt.Fprintf(tw, "  snapshots\tnone intact\n")
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
