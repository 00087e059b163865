package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/check"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Bounds that keep `walship check linear` safe to point at a real cluster.
const (
	maxCheckDuration = time.Hour
	maxCheckRate     = 20000
	maxCheckClients  = 64
)

// errNotLinearizable is returned (exit code 1) when the check finds a
// violation; the verdict line and the files are printed first.
var errNotLinearizable = errors.New("the history is not linearizable")

func checkLinearFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var (
		primaryAddr, replicaAddr, prefix, out string
		duration                              time.Duration
		clients, keys                         int
		rate                                  float64
		randomPolicies, keep                  bool
	)
	fs.StringVar(&primaryAddr, "primary", "127.0.0.1:7401", "the primary's gRPC address")
	fs.StringVar(&replicaAddr, "replica", "", "a replica's gRPC address: also check read-your-writes and monotonic reads there (optional)")
	fs.StringVar(&prefix, "prefix", "", "key prefix of every key the check writes (default: walship-check/<start time>/); nothing else is touched")
	fs.DurationVar(&duration, "duration", 30*time.Second, "how long to run the workload (at most 1h)")
	fs.IntVar(&clients, "concurrency", 6, "concurrent clients (at most 64)")
	fs.IntVar(&keys, "keys", 5, "keys in use at a time (fresh ones every 2 s)")
	fs.Float64Var(&rate, "rate", 500, "operations per second of all clients together (at most 20000)")
	fs.BoolVar(&randomPolicies, "random-policies", false, "give each write a random commit policy instead of the server's defaults")
	fs.BoolVar(&keep, "keep-keys", false, "leave the check's keys in place (by default they are deleted at the end)")
	fs.StringVar(&out, "out", "", "directory for the history and its visualisation when the check fails (default: a new temporary directory)")
	return func(ctx context.Context) error {
		switch {
		case duration <= 0 || duration > maxCheckDuration:
			return usageErr(env, "--duration: %v is not in (0, %v]", duration, maxCheckDuration)
		case rate <= 0 || rate > maxCheckRate:
			return usageErr(env, "--rate: %v is not in (0, %d]", rate, maxCheckRate)
		case clients < 1 || clients > maxCheckClients:
			return usageErr(env, "--concurrency: %d is not in 1..%d", clients, maxCheckClients)
		case keys < 1 || keys > 1000:
			return usageErr(env, "--keys: %d is not in 1..1000", keys)
		}
		if prefix == "" {
			prefix = "walship-check/" + strconv.FormatInt(time.Now().UnixNano(), 36) + "/"
		}
		pc, err := grpc.NewClient(primaryAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("--primary %s: %w", primaryAddr, err)
		}
		defer pc.Close()
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := walshipv1.NewAdminServiceClient(pc).Status(sctx, &walshipv1.StatusRequest{}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			return fmt.Errorf("--primary %s: status: %w", primaryAddr, err)
		}
		if st.Role != walshipv1.Role_ROLE_PRIMARY {
			return fmt.Errorf("--primary %s is a %s, not the primary", primaryAddr, st.Role)
		}
		w := check.Workload{Primary: walshipv1.NewKVServiceClient(pc), Prefix: prefix, Keys: keys, Concurrency: clients,
			Rate: rate, Defaults: st.DefaultPolicy}
		if randomPolicies {
			w.Policy = check.RandomPolicy
		}
		if replicaAddr != "" {
			rc, err := grpc.NewClient(replicaAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return fmt.Errorf("--replica %s: %w", replicaAddr, err)
			}
			defer rc.Close()
			w.Replica = walshipv1.NewKVServiceClient(rc)
		}
		fmt.Fprintf(env.Stdout, "checking %s for %v: %d clients, at most %.0f ops/s, keys under %q\n", primaryAddr, duration, clients, rate, prefix)
		h, session, err := w.Run(ctx, duration, nil)
		if err != nil {
			return err
		}
		res := check.Check(h, 5*time.Minute)
		if !keep {
			if n, err := w.DeleteKeys(context.WithoutCancel(ctx), h); err != nil {
				env.Logger.Warn("could not delete the check's keys", "deleted", n, "prefix", prefix, "err", err)
			}
		}
		fmt.Fprintln(env.Stdout, res)
		if replicaAddr != "" {
			fmt.Fprintf(env.Stdout, "replica %s: %d reads, %d read-your-writes or monotonic-read violations\n", replicaAddr, session.Reads, len(session.Violations))
			for _, v := range session.Violations {
				fmt.Fprintln(env.Stdout, "  "+v)
			}
		}
		if res.OK() && len(session.Violations) == 0 {
			return nil
		}
		if out == "" {
			if out, err = os.MkdirTemp("", "walship-check-"); err != nil {
				return err
			}
		}
		hist, html := filepath.Join(out, "history.json"), filepath.Join(out, "history.html")
		if err := h.Save(hist); err != nil {
			return err
		}
		if err := res.Visualize(html); err != nil {
			return err
		}
		for _, v := range res.Violations() {
			fmt.Fprintln(env.Stdout, "  "+v)
		}
		fmt.Fprintf(env.Stdout, "history: %s\nvisualisation: %s\n", hist, html)
		if !res.OK() {
			return errNotLinearizable
		}
		return errors.New("the replica's reads broke read-your-writes or went backwards")
	}
}

// usageErr prints a flag error like the flag package does and returns
// errUsage (exit code 2).
func usageErr(env *Env, format string, args ...any) error {
	fmt.Fprintf(env.Stderr, format+"\n", args...)
	return errUsage
}
