package cli

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc"
)

// supersededNode is a node whose promotion to epoch 2 another promotion
// overtook: its Status shows it in epoch 3, no longer the primary.
type supersededNode struct {
	walshipv1.UnimplementedAdminServiceServer
}

func (supersededNode) Promote(context.Context, *walshipv1.PromoteRequest) (*walshipv1.PromoteResponse, error) {
	return &walshipv1.PromoteResponse{Epoch: 2, Quorum: true}, nil
}

func (supersededNode) Status(context.Context, *walshipv1.StatusRequest) (*walshipv1.StatusResponse, error) {
	return &walshipv1.StatusResponse{Role: walshipv1.Role_ROLE_REPLICA, Epoch: 3,
		LastFailover: &walshipv1.FailoverTimeline{Epoch: 2}}, nil
}

// TestCtlPromoteSuperseded: a promotion that a newer epoch overtook
// (another promotion, a failover) fails at once, naming that epoch,
// rather than waiting out --wait for an epoch that can no longer open.
func TestCtlPromoteSuperseded(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	walshipv1.RegisterAdminServiceServer(srv, supersededNode{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	addr := lis.Addr().String()

	done := make(chan struct{})
	var code int
	var out, errOut string
	go func() {
		defer close(done)
		code, out, errOut = run(t, "ctl", "promote", "--node", addr, "--wait", "2m")
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("ctl promote still waits a minute after its node went to a newer epoch")
	}
	if code != 1 || !strings.Contains(errOut, "epoch 2 was superseded: "+addr+" is in epoch 3") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
