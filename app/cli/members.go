package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"google.golang.org/grpc"
)

// walship ctl members: the cluster's configuration (issue 38) — who
// counts for commits and promotions, a change in progress, the learners,
// and how far behind each is — as the primary holds it.

func ctlMembersListFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var nodes []string
	fs.Var(listFlag{&nodes}, "nodes", "gRPC addresses of nodes to ask, comma-separated: the primary answers (the others name it)")
	sf := addSecurityFlags(fs, false)
	return func(ctx context.Context) error {
		d, err := sf.dial(ctx, env.Logger)
		if err != nil {
			return err
		}
		if len(nodes) == 0 {
			return usageErr(env, "--nodes: required")
		}
		ms, err := listMembers(ctx, d, nodes)
		if err != nil {
			return err
		}
		return printMembership(env, ms)
	}
}

// listMembers asks each of nodes in turn for the configuration; the first
// that answers (the primary) wins. Every refusal is named when none does.
func listMembers(ctx context.Context, d serve.Dialer, nodes []string) (*walshipv1.MembershipStatus, error) {
	var errs []error
	for _, a := range nodes {
		resp, err := serve.Call(ctx, d, a, 3*time.Second, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.ListMembersResponse, error) {
			return walshipv1.NewAdminServiceClient(cc).ListMembers(ctx, &walshipv1.ListMembersRequest{})
		})
		if err == nil {
			return resp.GetMembership(), nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", a, err))
	}
	return nil, fmt.Errorf("no primary among --nodes: %w", errors.Join(errs...))
}

// printMembership shows the configuration: its contract, the change in
// progress, and a row per member with its voice and lag.
func printMembership(env *Env, ms *walshipv1.MembershipStatus) error {
	c := ms.GetContract()
	fmt.Fprintf(env.Stdout, "configuration of epoch %d, primary %s: %s\n", ms.GetEpoch(), ms.GetPrimaryId(), configLine(c.GetMembers(), c.GetLogstores(), c.GetSyncReplicas()))
	stage := strings.ToLower(strings.TrimPrefix(ms.GetStage().String(), "MEMBERSHIP_STAGE_"))
	switch n := c.GetNext(); {
	case n != nil:
		fmt.Fprintf(env.Stdout, "change in progress (joint: commits and promotions need both): to %s\n", configLine(n.GetMembers(), n.GetLogstores(), n.GetSyncReplicas()))
	case ms.GetChange() != "":
		fmt.Fprintf(env.Stdout, "change in progress: %s (last record: %s)\n", ms.GetChange(), stage)
	default:
		fmt.Fprintln(env.Stdout, "no change in progress")
	}
	if ms.GetChange() != "" && c.GetNext() != nil {
		fmt.Fprintf(env.Stdout, "the primary runs it: %s (last record: %s)\n", ms.GetChange(), stage)
	}
	if ls := c.GetLearners(); len(ls) > 0 {
		ids := make([]string, len(ls))
		for i, m := range ls {
			ids[i] = m.GetId()
		}
		fmt.Fprintf(env.Stdout, "learners (count for nothing): %s\n", strings.Join(ids, ", "))
	}
	if ls := c.GetLogstoreLearners(); len(ls) > 0 {
		fmt.Fprintf(env.Stdout, "log store learners (count for nothing): %s\n", strings.Join(ls, ", "))
	}
	w := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  ID\tADDRESS\tROLE\tVOICE\tCONNECTED\tREACHED\tLAG RECORDS\tLAG BYTES\tLAG SECONDS")
	for _, m := range ms.GetMembers() {
		role := strings.ToLower(strings.TrimPrefix(m.GetRole().String(), "ROLE_"))
		voice := strings.ToLower(strings.TrimPrefix(m.GetVoice().String(), "MEMBER_VOICE_"))
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%v\t%d\t%d\t%s\t%.2f\n", m.GetId(), dash(m.GetAddr()), role, voice, m.GetConnected(),
			m.GetReachedLsn(), m.GetLagRecords(), byteSize(m.GetLagBytes()), m.GetLagSeconds())
	}
	return w.Flush()
}

// configLine is one configuration in a line: its members, log stores and k.
func configLine(members []*walshipv1.Member, logstores []string, k uint32) string {
	ids := make([]string, len(members))
	for i, m := range members {
		ids[i] = m.GetId()
	}
	return fmt.Sprintf("members %s; log stores %s; sync_replicas %d", orDash(ids), orDash(logstores), k)
}

func orDash(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ", ")
}
