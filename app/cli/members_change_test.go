package cli

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// changeRecorder is an AdminService that records the ChangeMembers
// requests it gets and answers each one done.
type changeRecorder struct {
	walshipv1.UnimplementedAdminServiceServer
	mu   sync.Mutex
	reqs []*walshipv1.ChangeMembersRequest
}

func (c *changeRecorder) ChangeMembers(_ context.Context, req *walshipv1.ChangeMembersRequest) (*walshipv1.ChangeMembersResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reqs = append(c.reqs, req)
	return &walshipv1.ChangeMembersResponse{Done: true, Outcome: "done", Stage: walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL,
		Membership: &walshipv1.MembershipStatus{Contract: &walshipv1.Contract{}}}, nil
}

// TestCtlMembersLogStoreChanges: `walship ctl members add | remove
// --logstore ADDR` and `replace --logstore OLD=NEW` send the log store
// changes of ChangeMembers; wrong flags are usage errors that send
// nothing.
func TestCtlMembersLogStoreChanges(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &changeRecorder{}
	srv := grpc.NewServer()
	walshipv1.RegisterAdminServiceServer(srv, rec)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	p := lis.Addr().String()

	for _, tc := range []struct {
		args []string
		want *walshipv1.ChangeMembersRequest
	}{
		{[]string{"add", "--logstore", "ls4:7000"}, &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_AddLogstore{AddLogstore: "ls4:7000"}}},
		{[]string{"remove", "--logstore", "ls3:7000"}, &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_RemoveLogstore{RemoveLogstore: "ls3:7000"}}},
		{[]string{"replace", "--logstore", "ls3:7000=ls5:7000", "--max-lag-records", "10"}, &walshipv1.ChangeMembersRequest{MaxLagRecords: 10,
			Change: &walshipv1.ChangeMembersRequest_ReplaceLogstore{ReplaceLogstore: &walshipv1.LogStoreReplacement{Old: "ls3:7000", New: "ls5:7000"}}}},
		{[]string{"remove", "--member", "r2"}, &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Remove{Remove: "r2"}}},
	} {
		code, out, errOut := run(t, append([]string{"ctl", "members"}, append(tc.args, "--nodes", p)...)...)
		if code != 0 || !strings.Contains(out, "membership change done") {
			t.Fatalf("%v: exit %d\n%s\n%s", tc.args, code, out, errOut)
		}
		rec.mu.Lock()
		got := rec.reqs[len(rec.reqs)-1]
		rec.mu.Unlock()
		if !proto.Equal(got, tc.want) {
			t.Fatalf("%v sent %v, want %v", tc.args, got, tc.want)
		}
	}
	sent := len(rec.reqs)
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"replace", "--logstore", "ls3:7000"}, `--logstore: "ls3:7000" is not OLD=NEW`},
		{[]string{"replace"}, "--logstore: required, once, as OLD=NEW"},
		{[]string{"add", "--logstore", "ls4:7000", "--member", "r3=h:1"}, "--member or --logstore: required, one of them, once"},
		{[]string{"remove"}, "--member or --logstore: required, one of them, once"},
	} {
		code, _, errOut := run(t, append([]string{"ctl", "members"}, append(tc.args, "--nodes", p)...)...)
		if code != 2 || !strings.Contains(errOut, tc.err) {
			t.Fatalf("%v: exit %d, stderr:\n%s\nwant exit 2 and %q", tc.args, code, errOut, tc.err)
		}
	}
	if len(rec.reqs) != sent {
		t.Fatalf("a usage error sent a change: %v", rec.reqs[sent:])
	}
}
