package cli

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/logelect"
	"github.com/walship/walship/internal/serve"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// walship ctl: the operator's commands over AdminService (what patronictl
// or the cnpg plugin are to their systems); grpcurl works as well.

func dialNode(d serve.Dialer, addr string) (*grpc.ClientConn, error) {
	return d.Dial(addr)
}

// nodeStatus is the Status of the walship process at addr.
func nodeStatus(ctx context.Context, d serve.Dialer, addr string) (*walshipv1.StatusResponse, error) {
	return serve.Call(ctx, d, addr, 3*time.Second, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.StatusResponse, error) {
		return walshipv1.NewAdminServiceClient(cc).Status(ctx, &walshipv1.StatusRequest{})
	})
}

func ctlStatusFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var nodes []string
	fs.Var(listFlag{&nodes}, "nodes", "gRPC addresses of the nodes to show, comma-separated (data nodes and log stores)")
	sf := addSecurityFlags(fs, false)
	return func(ctx context.Context) error {
		d, err := sf.dial(ctx, env.Logger)
		if err != nil {
			return err
		}
		if len(nodes) == 0 {
			return usageErr(env, "--nodes: required")
		}
		type row struct {
			addr string
			st   *walshipv1.StatusResponse
			err  error
		}
		rows := make([]row, len(nodes))
		for i, a := range nodes {
			rows[i].addr = a
			rows[i].st, rows[i].err = nodeStatus(ctx, d, a)
		}
		w := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ADDRESS\tID\tROLE\tEPOCH\tPROMISED\tPRIMARY\tLAST\tDURABLE\tVISIBLE\tLAG\tSERVING\tWRITES\tARCHIVED\tORPHANS\tCLUSTER")
		clusters := map[string][]string{}
		var unreachable []row
		for _, r := range rows {
			if r.err != nil {
				// Every column filled, the error below the table: a row
				// with fewer cells would end tabwriter's column blocks
				// and shift the rows after it.
				fmt.Fprintf(w, "%s\t-\tunreachable%s\n", r.addr, strings.Repeat("\t-", 12))
				unreachable = append(unreachable, r)
				continue
			}
			cluster := r.st.GetClusterId()
			if cluster == "" {
				cluster = "-" // not joined yet, or older than cluster ids
			} else {
				clusters[cluster] = append(clusters[cluster], r.addr)
			}
			st := r.st
			lag := "-"
			if st.GetRole() == walshipv1.Role_ROLE_REPLICA && len(st.GetPeers()) > 0 {
				lag = fmt.Sprintf("%d rec, %.2fs", st.GetPeers()[0].GetLagRecords(), st.GetPeers()[0].GetLagSeconds())
			}
			role := strings.ToLower(strings.TrimPrefix(st.GetRole().String(), "ROLE_"))
			writes := "-"
			switch {
			case st.GetRole() == walshipv1.Role_ROLE_PRIMARY:
				writes = fmt.Sprint(st.GetTakingWrites())
			case st.GetRefilling():
				writes = "refilling" // a log store that takes none yet
			}
			archived := "-"
			if a := st.GetArchive(); a != nil {
				archived = fmt.Sprint(a.GetArchivedLsn())
				if a.GetUploader() {
					archived += " (uploading)"
				}
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\t%d\t%d\t%d\t%s\t%v\t%s\t%s\t%d\t%s\n", r.addr, st.GetId(), role, st.GetEpoch(), st.GetVoteEpoch(),
				dash(st.GetPrimaryId()), st.GetLastLsn(), st.GetDurableLsn(), st.GetVisibleLsn(), lag, st.GetServing(), writes, archived, len(st.GetOrphans()), cluster)
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if len(unreachable) > 0 {
			fmt.Fprintln(env.Stdout)
			for _, r := range unreachable {
				fmt.Fprintf(env.Stdout, "%s unreachable: %v\n", r.addr, r.err)
			}
		}
		if len(clusters) > 1 {
			fmt.Fprintf(env.Stdout, "\nwarning: these nodes belong to %d different clusters; a node of another cluster is refused by the others (docs/RUNBOOK.md, \"Cluster id mismatch\"):\n", len(clusters))
			ids := make([]string, 0, len(clusters))
			for id := range clusters {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			for _, id := range ids {
				fmt.Fprintf(env.Stdout, "  %s: %s\n", id, strings.Join(clusters[id], ", "))
			}
		}
		for _, r := range rows {
			if r.err == nil && r.st.GetRole() == walshipv1.Role_ROLE_PRIMARY {
				if len(r.st.GetPeers()) > 0 {
					if err := printPeers(env, r.addr, r.st); err != nil {
						return err
					}
				}
				if ms := r.st.GetMembership(); ms != nil {
					fmt.Fprintln(env.Stdout)
					if err := printMembership(env, ms); err != nil {
						return err
					}
				}
			}
		}
		printArchiveStatus(env, rows2archive(rows, func(r row) (*walshipv1.StatusResponse, error) { return r.st, r.err }))
		var els []*walshipv1.StatusResponse
		for _, r := range rows {
			if r.err == nil && r.st.GetElection() != nil {
				els = append(els, r.st)
			}
		}
		if err := printElection(env, els); err != nil {
			return err
		}
		for _, r := range rows {
			if tl := r.st.GetLastFailover(); tl != nil {
				fmt.Fprintf(env.Stdout, "\nlast promotion by %s:\n", r.st.GetId())
				printTimeline(env, tl)
			}
		}
		if len(unreachable) > 0 {
			return fmt.Errorf("%d of %d nodes unreachable", len(unreachable), len(rows))
		}
		return nil
	}
}

// printElection shows each data node's view of automatic failover's
// election on the log stores (--auto-failover): who holds it, whether the
// log stores hear the holder, and why the node contends or not.
func printElection(env *Env, sts []*walshipv1.StatusResponse) error {
	if len(sts) == 0 {
		return nil
	}
	fmt.Fprintln(env.Stdout, "\nELECTION (automatic failover, each data node's view of the log stores'):")
	w := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tHOLDER\tTERM\tHOLDER ALIVE\tPAUSED\tHOLDING\tCONTENDS\tLAST OUTCOME")
	for _, st := range sts {
		e := st.GetElection()
		alive := fmt.Sprintf("%v (%d of %d log stores)", e.GetPrimaryAlive(), e.GetAliveAt(), e.GetReached())
		last := dash(e.GetLastOutcome())
		if ns := e.GetLastOutcomeUnixNano(); ns != 0 {
			last = fmt.Sprintf("%s ago: %s", time.Since(time.Unix(0, ns)).Round(time.Millisecond), last)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%v\t%v\t%s\t%s\n", st.GetId(), dash(e.GetHolderId()), e.GetTerm(), alive, e.GetPaused(), e.GetHolding(), e.GetContend(), last)
	}
	return w.Flush()
}

// ctlFailoverFlags is walship ctl failover pause|resume: the pause state
// of automatic failover, kept in the log stores' election registers so
// that every node honours it and it survives restarts.
func ctlFailoverFlags(paused bool) func(fs *flag.FlagSet, env *Env) func(context.Context) error {
	return func(fs *flag.FlagSet, env *Env) func(context.Context) error {
		var logstores []string
		fs.Var(listFlag{&logstores}, "logstores", "the cluster's log store addresses, comma-separated (all of them: a majority must hold the change)")
		sf := addSecurityFlags(fs, false)
		return func(ctx context.Context) error {
			d, err := sf.dial(ctx, env.Logger)
			if err != nil {
				return err
			}
			if len(logstores) == 0 {
				return usageErr(env, "--logstores: required")
			}
			c, err := logelect.New(logelect.Config{LogStores: logstores, LeaseDuration: logelect.DefaultLeaseDuration,
				RenewDeadline: logelect.DefaultRenewDeadline, RetryPeriod: logelect.DefaultRetryPeriod, Dialer: d})
			if err != nil {
				return err
			}
			defer c.Close()
			v, err := c.SetPaused(ctx, paused)
			if err != nil {
				return fmt.Errorf("--logstores: %w", err)
			}
			what := "resumed: a replica promotes itself when the primary dies"
			if paused {
				what = "paused: no replica promotes itself until walship ctl failover resume (walship ctl promote still works)"
			}
			fmt.Fprintf(env.Stdout, "automatic failover %s\nelection: holder %s, term %d, holder alive at %d of %d log stores, pause version %d\n",
				what, dash(v.Holder), v.Term, v.AliveAt, v.Reached, v.PauseVersion)
			return nil
		}
	}
}

// printPeers shows every hop of a primary's: each replica and log store,
// whether its stream is up, the LSN it reached (a replica's applied, a
// log store's durable) and how far behind that is in records, bytes and
// seconds.
func printPeers(env *Env, addr string, st *walshipv1.StatusResponse) error {
	fmt.Fprintf(env.Stdout, "\npeers of primary %s (%s):\n", st.GetId(), addr)
	w := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  PEER\tROLE\tCONNECTED\tREACHED\tLAG RECORDS\tLAG BYTES\tLAG SECONDS")
	for _, p := range st.GetPeers() {
		role := strings.ToLower(strings.TrimPrefix(p.GetRole().String(), "ROLE_"))
		reached := p.GetAppliedLsn()
		if p.GetRole() == walshipv1.Role_ROLE_LOGSTORE {
			reached = p.GetFlushedLsn()
		}
		fmt.Fprintf(w, "  %s\t%s\t%v\t%d\t%d\t%s\t%.2f\n", p.GetId(), role, p.GetConnected(), reached, p.GetLagRecords(), byteSize(p.GetLagBytes()), p.GetLagSeconds())
	}
	return w.Flush()
}

// dash is s, or "-" for an empty cell.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// rows2archive returns the archive statuses of the rows that answered.
func rows2archive[R any](rows []R, get func(R) (*walshipv1.StatusResponse, error)) []*walshipv1.StatusResponse {
	var out []*walshipv1.StatusResponse
	for _, r := range rows {
		if st, err := get(r); err == nil && st.GetArchive() != nil {
			out = append(out, st)
		}
	}
	return out
}

// printArchiveStatus says where the archive is and how far behind, from
// the primary's view if it is among sts, and any upload error a log
// store reports.
func printArchiveStatus(env *Env, sts []*walshipv1.StatusResponse) {
	if len(sts) == 0 {
		return
	}
	var view *walshipv1.ArchiveStatus
	for _, st := range sts {
		if st.GetRole() == walshipv1.Role_ROLE_PRIMARY {
			view = st.GetArchive()
		}
	}
	if view == nil {
		view = sts[0].GetArchive()
	}
	fmt.Fprintf(env.Stdout, "\narchive %s: archived LSN %d", view.GetUrl(), view.GetArchivedLsn())
	if view.GetUploaderAddr() != "" {
		fmt.Fprintf(env.Stdout, ", %.1fs (%s) behind, uploaded by %s", view.GetLagSeconds(), byteSize(view.GetLagBytes()), view.GetUploaderAddr())
	}
	fmt.Fprintln(env.Stdout)
	for _, st := range sts {
		if e := st.GetArchive().GetError(); e != "" {
			fmt.Fprintf(env.Stdout, "  %s cannot upload: %s\n", st.GetId(), e)
		}
	}
}

func printTimeline(env *Env, tl *walshipv1.FailoverTimeline) {
	at := func(ns int64) string {
		if ns == 0 {
			return "-"
		}
		return time.Unix(0, ns).UTC().Format(time.RFC3339Nano)
	}
	w := env.Stdout
	fmt.Fprintf(w, "  epoch %d (from epoch %d, primary %q)\n", tl.GetEpoch(), tl.GetPreviousEpoch(), tl.GetPreviousPrimary())
	fmt.Fprintf(w, "  started %s, fenced %s\n", at(tl.GetStartedUnixNano()), at(tl.GetFencedUnixNano()))
	fmt.Fprintf(w, "  promised: %s\n", strings.Join(tl.GetGranted(), ", "))
	if len(tl.GetRefused()) > 0 {
		fmt.Fprintf(w, "  not: %s\n", strings.Join(tl.GetRefused(), "; "))
	}
	if tl.GetFailure() != "" {
		fmt.Fprintf(w, "  stopped after fencing: %s\n", tl.GetFailure())
	}
	fmt.Fprintf(w, "  donor %s; caught up %d records (%d bytes); cut %d records into an orphan file; waited %v for the old primary's lease; epoch starts at LSN %d\n",
		tl.GetDonor(), tl.GetCaughtUpRecords(), tl.GetCaughtUpBytes(), tl.GetCutRecords(), tl.GetLeaseWait().AsDuration(), tl.GetStartLsn())
}

func ctlPromoteFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var (
		addr       string
		dry, force bool
		depose     bool
		epoch      uint64
		wait       time.Duration
	)
	fs.StringVar(&addr, "node", "", "gRPC address of the replica to promote (required)")
	fs.BoolVar(&dry, "dry-run", false, "only report what a promotion would see, need and risk")
	fs.BoolVar(&force, "force", false, "promote with a log store majority even without the replicas the contract needs (may lose the commits a dry run names)")
	fs.BoolVar(&depose, "depose", false, "promote although a primary is serving, fencing it and losing what it has not shipped (use switchover for that: it loses nothing)")
	fs.Uint64Var(&epoch, "epoch", 0, "epoch to open (0: the highest seen + 1)")
	fs.DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the new primary to take writes")
	sf := addSecurityFlags(fs, false)
	return func(ctx context.Context) error {
		d, err := sf.dial(ctx, env.Logger)
		if err != nil {
			return err
		}
		if addr == "" {
			return usageErr(env, "--node: required")
		}
		conn, err := dialNode(d, addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		admin := walshipv1.NewAdminServiceClient(conn)
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		resp, err := admin.Promote(pctx, &walshipv1.PromoteRequest{Epoch: epoch, DryRun: dry, Force: force, Depose: depose})
		if err != nil {
			return fmt.Errorf("promote %s: %w", addr, err)
		}
		verb := "promoting"
		if dry {
			verb = "a promotion would open"
		}
		fmt.Fprintf(env.Stdout, "%s epoch %d on %s: quorum %v (needs %s)\n", verb, resp.GetEpoch(), addr, resp.GetQuorum(), resp.GetNeeded())
		fmt.Fprintf(env.Stdout, "most advanced log: LSN %d on %s\n", resp.GetHighestLsn(), resp.GetTimeline().GetDonor())
		switch {
		case resp.GetAtRiskToLsn() != 0:
			fmt.Fprintf(env.Stdout, "at risk: LSNs %d..%d the old primary reported and no answer holds (fsynced there up to %d: sync-durability commits may have been acknowledged)\n",
				resp.GetAtRiskFromLsn(), resp.GetAtRiskToLsn(), resp.GetAtRiskDurableToLsn())
		case resp.GetQuorum():
			fmt.Fprintln(env.Stdout, "at risk: nothing (every LSN the old primary reported is held by an answer)")
		}
		if !resp.GetQuorum() {
			// What the members that did not answer hold, no answer can
			// tell: the range above is a lower bound, and here the loss
			// is known to start only.
			fmt.Fprintf(env.Stdout, "at risk without a quorum: any commit after LSN %d that only the members that did not answer hold; how many, the answers cannot say (a forced promotion loses them; those members keep them in orphan files when they rejoin: walship ctl orphans)\n",
				resp.GetHighestLsn())
		}
		sp := resp.GetServingPrimary()
		if sp != nil {
			fmt.Fprintf(env.Stdout, "serving primary: %s at %s takes writes in epoch %d; a promotion would depose it and lose what it has not shipped: use `walship ctl switchover --primary %s --target %s` instead (nothing lost), or --depose\n",
				sp.GetId(), sp.GetAddr(), sp.GetEpoch(), sp.GetAddr(), nodeID(ctx, d, addr))
		}
		if dry {
			// A dry run fails when the promotion would: a script that
			// checks first then promotes must not go on.
			switch {
			case !resp.GetQuorum() && !force:
				return fmt.Errorf("a promotion of %s would fail: it needs %s (--force goes on with a log store majority, losing what the missing replicas alone hold)", addr, resp.GetNeeded())
			case sp != nil && !depose:
				return fmt.Errorf("a promotion of %s would be refused: %s is the primary and takes writes; use `walship ctl switchover --primary %s --target %s`", addr, sp.GetId(), sp.GetAddr(), nodeID(ctx, d, addr))
			}
			return nil
		}
		for {
			sctx, scancel := context.WithTimeout(pctx, time.Second)
			st, err := admin.Status(sctx, &walshipv1.StatusRequest{}, grpc.WaitForReady(true))
			scancel()
			if err == nil && st.GetRole() == walshipv1.Role_ROLE_PRIMARY && st.GetTakingWrites() {
				fmt.Fprintf(env.Stdout, "%s is the primary of epoch %d, taking writes, %v after the call\n", addr, st.GetEpoch(), time.Since(start).Round(time.Millisecond))
				if tl := st.GetLastFailover(); tl != nil {
					printTimeline(env, tl)
				}
				return nil
			}
			if tl := st.GetLastFailover(); err == nil && tl.GetEpoch() == resp.GetEpoch() && tl.GetFailure() != "" {
				return fmt.Errorf("%s fenced epoch %d but did not open it: %s", addr, resp.GetEpoch(), tl.GetFailure())
			}
			if err == nil && st.GetEpoch() > resp.GetEpoch() {
				// Another promotion or a failover overtook this one (it may
				// have opened and been deposed since): epoch resp's can no
				// longer open.
				return fmt.Errorf("epoch %d was superseded: %s is in epoch %d, as %v (walship ctl status)", resp.GetEpoch(), addr, st.GetEpoch(), roleName(st.GetRole()))
			}
			if pctx.Err() != nil {
				return fmt.Errorf("%s did not open epoch %d within --wait %v (last status: %v)", addr, resp.GetEpoch(), wait, err)
			}
			t := time.NewTimer(10 * time.Millisecond)
			select {
			case <-t.C:
			case <-pctx.Done():
			}
		}
	}
}

func ctlSwitchoverFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var (
		addr, target string
		timeout      time.Duration
	)
	fs.StringVar(&addr, "primary", "127.0.0.1:7401", "gRPC address of the primary")
	fs.StringVar(&target, "target", "", "node id of the replica to hand over to (required)")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "how long the target may take to catch up")
	sf := addSecurityFlags(fs, false)
	return func(ctx context.Context) error {
		d, err := sf.dial(ctx, env.Logger)
		if err != nil {
			return err
		}
		if target == "" {
			return usageErr(env, "--target: required: the node id of the member to hand over to%s", memberHint(ctx, d, addr))
		}
		conn, err := dialNode(d, addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		resp, err := walshipv1.NewAdminServiceClient(conn).Switchover(ctx, &walshipv1.SwitchoverRequest{Target: target, Timeout: durationpb.New(timeout)})
		if err != nil {
			return fmt.Errorf("switchover to %s: %w", target, err)
		}
		soFar := ""
		if !resp.GetTargetTakingWrites() {
			soFar = " so far: it is still opening its epoch (walship ctl status shows when it takes writes)"
		}
		fmt.Fprintf(env.Stdout, "%s is the primary of epoch %d; it had flushed LSN %d; writes paused %v%s\n", target, resp.GetEpoch(), resp.GetLsn(), resp.GetPaused().AsDuration().Round(time.Millisecond), soFar)
		return nil
	}
}

// memberHint lists the members the primary at addr could hand over to
// (", one of a, b"), or says nothing if it cannot tell.
func memberHint(ctx context.Context, d serve.Dialer, addr string) string {
	st, err := nodeStatus(ctx, d, addr)
	if err != nil {
		return ""
	}
	var ids []string
	for _, m := range st.GetContract().GetMembers() {
		if m.GetId() != st.GetId() {
			ids = append(ids, m.GetId())
		}
	}
	if len(ids) == 0 {
		return ""
	}
	return ", one of " + strings.Join(ids, ", ")
}

// nodeID is the node id of the data node at addr ("<node id>" if it does
// not say).
func nodeID(ctx context.Context, d serve.Dialer, addr string) string {
	if st, err := nodeStatus(ctx, d, addr); err == nil && st.GetId() != "" {
		return st.GetId()
	}
	return "<node id>"
}
