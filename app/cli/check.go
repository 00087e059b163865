package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/check"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/pkg/client"
	"google.golang.org/grpc"
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
	sf := addSecurityFlags(fs, false)
	return func(ctx context.Context) error {
		d, err := sf.dial(ctx, env.Logger)
		if err != nil {
			return err
		}
		if err := checkLoadBounds(env, duration, rate, clients); err != nil {
			return err
		}
		if keys < 1 || keys > 1000 {
			return usageErr(env, "--keys: %d is not in 1..1000", keys)
		}
		if prefix == "" {
			prefix = newCheckPrefix()
		}
		pc, err := d.Dial(primaryAddr)
		if err != nil {
			return fmt.Errorf("--primary %s: %w", primaryAddr, err)
		}
		defer pc.Close()
		st, err := primaryStatus(ctx, pc, primaryAddr)
		if err != nil {
			return err
		}
		w := check.Workload{Primary: walshipv1.NewKVServiceClient(pc), Prefix: prefix, Keys: keys, Concurrency: clients,
			Rate: rate, Defaults: st.DefaultPolicy}
		if randomPolicies {
			w.Policy = check.RandomPolicy
		}
		if replicaAddr != "" {
			rc, err := d.Dial(replicaAddr)
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
		return reportLinear(env, h, res, session, replicaAddr, out)
	}
}

// checkLoadBounds refuses a check's load flags outside the bounds that
// keep it safe to point at a real cluster.
func checkLoadBounds(env *Env, duration time.Duration, rate float64, clients int) error {
	switch {
	case duration <= 0 || duration > maxCheckDuration:
		return usageErr(env, "--duration: %v is not in (0, %v]", duration, maxCheckDuration)
	case rate <= 0 || rate > maxCheckRate:
		return usageErr(env, "--rate: %v is not in (0, %d]", rate, maxCheckRate)
	case clients < 1 || clients > maxCheckClients:
		return usageErr(env, "--concurrency: %d is not in 1..%d", clients, maxCheckClients)
	}
	return nil
}

// newCheckPrefix is the default prefix of a check's keys, new at every
// start: walship-check/<start time>/.
func newCheckPrefix() string {
	return "walship-check/" + strconv.FormatInt(time.Now().UnixNano(), 36) + "/"
}

// primaryStatus is the status of the node at addr, which must be the
// primary.
func primaryStatus(ctx context.Context, conn *grpc.ClientConn, addr string) (*walshipv1.StatusResponse, error) {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	st, err := walshipv1.NewAdminServiceClient(conn).Status(sctx, &walshipv1.StatusRequest{}, grpc.WaitForReady(true))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("--primary %s: status: %w", addr, err)
	}
	if st.Role != walshipv1.Role_ROLE_PRIMARY {
		return nil, fmt.Errorf("--primary %s is %s, not the primary%s", addr, roleName(st.Role), primaryHint(st))
	}
	return st, nil
}

// roleName is role in words: "a replica", "a log store".
func roleName(role walshipv1.Role) string {
	switch role {
	case walshipv1.Role_ROLE_REPLICA:
		return "a replica"
	case walshipv1.Role_ROLE_LOGSTORE:
		return "a log store"
	case walshipv1.Role_ROLE_PRIMARY:
		return "the primary"
	}
	return "a " + role.String()
}

// primaryHint is "; the primary is <id> at <addr>" from a node's status,
// or "" if it knows of none.
func primaryHint(st *walshipv1.StatusResponse) string {
	if st.GetPrimary() == "" {
		return ""
	}
	if st.GetPrimaryId() == "" {
		return "; the primary is at " + st.GetPrimary()
	}
	return fmt.Sprintf("; the primary is %s at %s", st.GetPrimaryId(), st.GetPrimary())
}

// reportLinear prints the verdict of `check linear` and the replica's
// session violations, and on a failure writes the history to out.
func reportLinear(env *Env, h *check.History, res check.Result, session check.SessionReport, replicaAddr, out string) error {
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
	if err := writeViolation(env, h, res, out); err != nil {
		return err
	}
	if !res.OK() {
		return errNotLinearizable
	}
	return errors.New("the replica's reads broke read-your-writes or went backwards")
}

// usageErr prints a flag error like the flag package does and returns
// errUsage (exit code 2).
func usageErr(env *Env, format string, args ...any) error {
	fmt.Fprintf(env.Stderr, format+"\n", args...)
	return errUsage
}

// failoverCheck is `walship check failover`: its flags, and the check.
type failoverCheck struct {
	dialer                      serve.Dialer // the tool's (--tls-*)
	nodes                       []string
	fault, killCmd, prefix, out string
	duration, after             time.Duration
	clients                     int
	rate                        float64
	// auto: for --fault kill, the cluster fails over by itself
	// (--auto-failover): the check promotes no one, it waits.
	auto bool
}

func checkFailoverFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var c failoverCheck
	fs.Var(listFlag{&c.nodes}, "nodes", "gRPC addresses of the cluster's data nodes, comma-separated (required)")
	fs.StringVar(&c.fault, "fault", "switchover", "the fault: switchover (planned: nothing may be lost), or kill (run --kill-command, then promote the most advanced replica)")
	fs.StringVar(&c.killCmd, "kill-command", "", "for --fault kill: a shell command that kills the primary (kill -9, SIGSTOP, a VM power-off)")
	fs.BoolVar(&c.auto, "auto-failover", false, "for --fault kill: promote no one, wait for the cluster's automatic failover (walship node --auto-failover, walship dev) to make a replica the primary")
	fs.DurationVar(&c.duration, "duration", 20*time.Second, "how long to run the workload (at most 1h)")
	fs.DurationVar(&c.after, "fault-after", 0, "when to inject the fault (default: a third of --duration)")
	fs.IntVar(&c.clients, "concurrency", 6, "concurrent clients (at most 64)")
	fs.Float64Var(&c.rate, "rate", 500, "operations per second of all clients together (at most 20000)")
	fs.StringVar(&c.prefix, "prefix", "", "key prefix of every key the check writes (default: walship-check/<start time>/)")
	fs.StringVar(&c.out, "out", "", "directory for the history and its visualisation when the check fails (default: a new temporary directory)")
	sf := addSecurityFlags(fs, false)
	return func(ctx context.Context) error {
		var err error
		if c.dialer, err = sf.dial(ctx, env.Logger); err != nil {
			return err
		}
		if err := c.validate(env); err != nil {
			return err
		}
		return c.run(ctx, env)
	}
}

// validate refuses bad flags and fills in the defaults of --fault-after
// and --prefix.
func (c *failoverCheck) validate(env *Env) error {
	switch {
	case len(c.nodes) < 2:
		return usageErr(env, "--nodes: at least two data nodes")
	case c.fault != "switchover" && c.fault != "kill":
		return usageErr(env, "--fault: %q is not switchover or kill", c.fault)
	case c.fault == "kill" && c.killCmd == "":
		return usageErr(env, "--kill-command: required with --fault kill")
	}
	if err := checkLoadBounds(env, c.duration, c.rate, c.clients); err != nil {
		return err
	}
	if c.after <= 0 {
		c.after = c.duration / 3
	}
	if c.prefix == "" {
		c.prefix = newCheckPrefix()
	}
	return nil
}

// afterFaultKey is the key of the write that shows a primary takes writes
// after the fault.
func (c *failoverCheck) afterFaultKey() string { return c.prefix + "after-fault" }

// run runs the workload through the fault, reads every key back and
// checks the history.
func (c *failoverCheck) run(ctx context.Context, env *Env) error {
	cl, err := client.New(c.nodes, client.Options{Retry: 30 * time.Second, DialOptions: c.dialer.Options()})
	if err != nil {
		return err
	}
	defer cl.Close()
	w := check.Workload{Primary: cl.KV(), Prefix: c.prefix, Concurrency: c.clients, Rate: c.rate}
	h := check.NewHistory()
	if err := c.runWithFault(ctx, env, cl, w, h); err != nil {
		return err
	}
	if err := w.ReadBack(ctx, h); err != nil {
		return err
	}
	res := check.Check(h, 5*time.Minute)
	if _, err := w.DeleteKeys(context.WithoutCancel(ctx), h); err != nil {
		env.Logger.Warn("could not delete the check's keys", "prefix", c.prefix, "err", err)
	}
	// Not in the history: the write that showed the new primary took writes.
	if _, _, err := cl.Delete(context.WithoutCancel(ctx), c.afterFaultKey(), nil); err != nil {
		env.Logger.Warn("could not delete the check's key", "key", c.afterFaultKey(), "err", err)
	}
	fmt.Fprintln(env.Stdout, res)
	if res.OK() {
		return nil
	}
	if err := writeViolation(env, h, res, c.out); err != nil {
		return err
	}
	return errNotLinearizable
}

// runWithFault runs w into h for --duration, injects the fault at
// --fault-after, and waits for a write the new primary acknowledges and
// for the workload to end.
func (c *failoverCheck) runWithFault(ctx context.Context, env *Env, cl *client.Client, w check.Workload, h *check.History) error {
	primaryAddr, err := cl.Primary(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "checking %s for %v, %s after %v: %d clients, at most %.0f ops/s, keys under %q\n",
		strings.Join(c.nodes, ","), c.duration, c.fault, c.after, c.clients, c.rate, c.prefix)
	done := make(chan error, 1)
	go func() {
		_, _, err := w.Run(ctx, c.duration, h)
		done <- err
	}()
	t := time.NewTimer(c.after)
	select {
	case err := <-done:
		t.Stop()
		return fmt.Errorf("the workload ended before the fault: %v", err)
	case <-t.C:
	}
	faultAt := time.Now()
	if err := injectFault(ctx, c.dialer, env, h, c.fault, c.killCmd, primaryAddr, c.nodes, c.auto); err != nil {
		<-done
		return err
	}
	if _, err := cl.Put(ctx, c.afterFaultKey(), []byte("x"), nil); err != nil {
		<-done
		return fmt.Errorf("no write acknowledged after the fault: %w", err)
	}
	newPrimary, _ := cl.Primary(ctx)
	fmt.Fprintf(env.Stdout, "%s: %s → %s; writes acknowledged again %v after the fault\n", c.fault, primaryAddr, newPrimary, time.Since(faultAt).Round(time.Millisecond))
	return <-done
}

// injectFault switches over to another data node, or runs killCmd and
// promotes the most advanced replica that can reach its quorum.
func injectFault(ctx context.Context, d serve.Dialer, env *Env, h *check.History, fault, killCmd, primaryAddr string, nodes []string, auto bool) error {
	statuses := map[string]*walshipv1.StatusResponse{}
	for _, a := range nodes {
		if st, err := nodeStatus(ctx, d, a); err == nil {
			statuses[a] = st
		}
	}
	// Candidates: replicas, most advanced first.
	var cands []string
	for a, st := range statuses {
		if st.GetRole() == walshipv1.Role_ROLE_REPLICA {
			cands = append(cands, a)
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		a, b := statuses[cands[i]], statuses[cands[j]]
		return a.GetEpoch() > b.GetEpoch() || (a.GetEpoch() == b.GetEpoch() && a.GetDurableLsn() > b.GetDurableLsn())
	})
	if len(cands) == 0 {
		return fmt.Errorf("no replica among %s to fail over to", strings.Join(nodes, ","))
	}
	switch fault {
	case "switchover":
		h.Note("switchover to %s", statuses[cands[0]].GetId())
		conn, err := dialNode(d, primaryAddr)
		if err != nil {
			return err
		}
		defer conn.Close()
		resp, err := walshipv1.NewAdminServiceClient(conn).Switchover(ctx, &walshipv1.SwitchoverRequest{Target: statuses[cands[0]].GetId()})
		if err != nil {
			return fmt.Errorf("switchover: %w", err)
		}
		soFar := ""
		if !resp.GetTargetTakingWrites() {
			soFar = " so far (it is still opening its epoch)"
		}
		fmt.Fprintf(env.Stdout, "switched over to %s (epoch %d), writes paused %v%s\n", statuses[cands[0]].GetId(), resp.GetEpoch(), resp.GetPaused().AsDuration().Round(time.Millisecond), soFar)
		return nil
	default:
		h.Note("kill: %s", killCmd)
		if out, err := exec.CommandContext(ctx, "sh", "-c", killCmd).CombinedOutput(); err != nil {
			return fmt.Errorf("--kill-command: %v\n%s", err, out)
		}
		if auto {
			return awaitAutoFailover(ctx, d, env, h, cands, statuses)
		}
		var errs []string
		for _, a := range cands {
			resp, err := serve.Call(ctx, d, a, 30*time.Second, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.PromoteResponse, error) {
				return walshipv1.NewAdminServiceClient(cc).Promote(ctx, &walshipv1.PromoteRequest{})
			})
			if err == nil {
				h.Note("%s promoted (epoch %d)", statuses[a].GetId(), resp.GetEpoch())
				fmt.Fprintf(env.Stdout, "promoted %s to epoch %d (donor %s, waited %v for the old primary's lease)\n", statuses[a].GetId(), resp.GetEpoch(),
					resp.GetTimeline().GetDonor(), resp.GetTimeline().GetLeaseWait().AsDuration().Round(time.Millisecond))
				return nil
			}
			errs = append(errs, fmt.Sprintf("%s: %v", a, err))
		}
		return fmt.Errorf("no replica could be promoted: %s", strings.Join(errs, "; "))
	}
}

// awaitAutoFailover waits, up to a minute, for one of cands to be the
// primary and take writes by the cluster's automatic failover.
func awaitAutoFailover(ctx context.Context, d serve.Dialer, env *Env, h *check.History, cands []string, statuses map[string]*walshipv1.StatusResponse) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		for _, a := range cands {
			st, err := nodeStatus(ctx, d, a)
			if err == nil && st.GetRole() == walshipv1.Role_ROLE_PRIMARY && st.GetTakingWrites() {
				h.Note("%s promoted itself (epoch %d)", st.GetId(), st.GetEpoch())
				fmt.Fprintf(env.Stdout, "%s promoted itself to epoch %d, %v after the kill\n", st.GetId(), st.GetEpoch(), time.Since(start).Round(time.Millisecond))
				return nil
			}
		}
		select {
		case <-ctx.Done():
			var why []string
			for _, a := range cands {
				if st, err := nodeStatus(context.WithoutCancel(ctx), d, a); err == nil {
					why = append(why, fmt.Sprintf("%s: %s", statuses[a].GetId(), dash(st.GetElection().GetContend())))
				}
			}
			return fmt.Errorf("--auto-failover: no replica promoted itself within a minute of the kill (%s)", strings.Join(why, "; "))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writeViolation writes a failed check's history and its visualisation to
// dir (a new temporary directory if empty) and prints where, with the keys
// that are not linearizable.
func writeViolation(env *Env, h *check.History, res check.Result, dir string) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "walship-check-")
		if err != nil {
			return err
		}
		dir = d
	}
	hist, html := filepath.Join(dir, "history.json"), filepath.Join(dir, "history.html")
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
	return nil
}
