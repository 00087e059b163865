package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// walship ctl members add | remove | replace: a membership change at run
// time (AdminService.ChangeMembers), at the primary. add makes a running
// data node (a replica of this cluster) or log store a learner, then a
// member once it has caught up, through a joint configuration; remove
// takes a member or log store out through a joint configuration, whether
// or not it answers; replace swaps a log store for another in one change
// (the new one a learner first). The command waits until the change is
// over, or --timeout: the change then goes on (ctl members list shows
// it).

// What a membership change command does.
const (
	changeAdd = iota
	changeRemove
	changeReplace
)

func ctlMembersAddFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	return ctlMembersChangeFlags(fs, env, changeAdd)
}

func ctlMembersRemoveFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	return ctlMembersChangeFlags(fs, env, changeRemove)
}

func ctlMembersReplaceFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	return ctlMembersChangeFlags(fs, env, changeReplace)
}

func ctlMembersChangeFlags(fs *flag.FlagSet, env *Env, kind int) func(context.Context) error {
	var (
		nodes, member, logstore []string
		maxLag                  uint64
		catchUp                 time.Duration
		timeout                 time.Duration
	)
	fs.Var(listFlag{&nodes}, "nodes", "gRPC addresses of nodes to ask, comma-separated: the primary runs the change (the others name it)")
	switch kind {
	case changeAdd:
		fs.Var(listFlag{&member}, "member", "the data node to add, as ID=ADDR (its node id and advertised gRPC address); it must be running as a replica of this cluster")
		fs.Var(listFlag{&logstore}, "logstore", "the log store to add, by address (instead of --member); start it first, with --peers naming the cluster's log stores so that it refills their log")
	case changeRemove:
		fs.Var(listFlag{&member}, "member", "node id of the member to remove (not the primary: hand its role over first with ctl switchover)")
		fs.Var(listFlag{&logstore}, "logstore", "address of the log store to remove (instead of --member); it need not answer")
	case changeReplace:
		fs.Var(listFlag{&logstore}, "logstore", "the log store to replace and the one to put in its place, as OLD=NEW (addresses); start NEW first, with --peers naming the cluster's log stores")
	}
	if kind != changeRemove {
		fs.Uint64Var(&maxLag, "max-lag-records", 0, "how close (LSNs behind the primary) the learner must come before it becomes a member (0: the primary's default, 1000)")
		fs.DurationVar(&catchUp, "catch-up-timeout", 0, "how long the learner may take to catch up before the change is abandoned (0: the primary's default, 5m)")
	}
	fs.DurationVar(&timeout, "timeout", 10*time.Minute, "how long to wait for the change to finish; it goes on after (ctl members list shows it)")
	sf := addSecurityFlags(fs, false)
	return func(ctx context.Context) error {
		d, err := sf.dial(ctx, env.Logger)
		if err != nil {
			return err
		}
		if len(nodes) == 0 {
			return usageErr(env, "--nodes: required")
		}
		req := &walshipv1.ChangeMembersRequest{MaxLagRecords: maxLag}
		if catchUp > 0 {
			req.CatchUpTimeout = durationpb.New(catchUp)
		}
		switch {
		case kind == changeReplace && len(logstore) != 1:
			return usageErr(env, "--logstore: required, once, as OLD=NEW")
		case kind == changeReplace:
			old, nw, ok := strings.Cut(logstore[0], "=")
			if !ok || old == "" || nw == "" {
				return usageErr(env, "--logstore: %q is not OLD=NEW", logstore[0])
			}
			req.Change = &walshipv1.ChangeMembersRequest_ReplaceLogstore{ReplaceLogstore: &walshipv1.LogStoreReplacement{Old: old, New: nw}}
		case len(member)+len(logstore) != 1:
			return usageErr(env, "--member or --logstore: required, one of them, once")
		case len(logstore) == 1 && kind == changeAdd:
			req.Change = &walshipv1.ChangeMembersRequest_AddLogstore{AddLogstore: logstore[0]}
		case len(logstore) == 1:
			req.Change = &walshipv1.ChangeMembersRequest_RemoveLogstore{RemoveLogstore: logstore[0]}
		case kind == changeAdd:
			id, addr, ok := strings.Cut(member[0], "=")
			if !ok || id == "" || addr == "" {
				return usageErr(env, "--member: %q is not ID=ADDR", member[0])
			}
			req.Change = &walshipv1.ChangeMembersRequest_Add{Add: &walshipv1.Member{Id: id, Addr: addr}}
		default:
			req.Change = &walshipv1.ChangeMembersRequest_Remove{Remove: member[0]}
		}
		resp, err := changeMembers(ctx, d, nodes, timeout, req)
		if err != nil {
			return err
		}
		stage := strings.ToLower(strings.TrimPrefix(resp.GetStage().String(), "MEMBERSHIP_STAGE_"))
		if resp.GetDone() {
			fmt.Fprintf(env.Stdout, "membership change %s (last record: %s)\n", resp.GetOutcome(), stage)
		} else {
			fmt.Fprintf(env.Stdout, "membership change still in progress after %v (last record: %s); it goes on: walship ctl members list shows it\n", timeout, stage)
		}
		return printMembership(env, resp.GetMembership())
	}
}

// changeMembers sends req to each of nodes in turn until one takes it
// (the primary): a node that is not the primary refuses at once, naming
// it. A refusal by the primary ends the command.
func changeMembers(ctx context.Context, d serve.Dialer, nodes []string, timeout time.Duration, req *walshipv1.ChangeMembersRequest) (*walshipv1.ChangeMembersResponse, error) {
	var errs []string
	for _, a := range nodes {
		resp, err := serve.Call(ctx, d, a, timeout, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.ChangeMembersResponse, error) {
			return walshipv1.NewAdminServiceClient(cc).ChangeMembers(ctx, req)
		})
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Sprintf("%s: %v", a, err))
		if !strings.Contains(err.Error(), "not the primary") && !strings.Contains(err.Error(), "is a log store") {
			break // the primary's own refusal
		}
	}
	return nil, fmt.Errorf("membership change refused: %s", strings.Join(errs, "; "))
}
