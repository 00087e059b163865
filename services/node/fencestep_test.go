package node

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/serve"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// jumpingNode grants a fence newer than its promise within
// datadir.MaxEpochJump of it, refuses one further (INVALID_ARGUMENT, as
// every node does), and records what it was asked.
type jumpingNode struct {
	walshipv1.UnimplementedEpochServiceServer
	mu       sync.Mutex
	promised uint64
	asked    []uint64
}

func (n *jumpingNode) Fence(_ context.Context, req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.asked = append(n.asked, req.GetEpoch())
	if err := datadir.CheckEpoch(req.GetEpoch(), n.promised, datadir.MaxEpochJump); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "epoch: %v", err)
	}
	if req.GetEpoch() <= n.promised {
		return &walshipv1.FenceResponse{Epoch: n.promised}, nil
	}
	n.promised = req.GetEpoch()
	return &walshipv1.FenceResponse{Granted: true, Epoch: n.promised}, nil
}

// TestFenceStepping: a node whose promise is more than
// datadir.MaxEpochJump behind the epoch a candidate fences is fenced in
// steps of at most the jump, from the promise the survey found, and
// grants the epoch at the end; a node that promised more meanwhile is
// stepped from there; one within the jump, or further than
// datadir.MaxEpochGap, is fenced once.
func TestFenceStepping(t *testing.T) {
	const j = datadir.MaxEpochJump
	for _, tc := range []struct {
		name               string
		surveyed, promised uint64 // what the survey found, what the node holds
		epoch              uint64
		asked              []uint64
		granted            bool
	}{
		{"within the jump", 5, 5, 5 + j, []uint64{5 + j}, true},
		{"three jumps", 5, 5, 5 + 3*j, []uint64{5 + j, 5 + 2*j, 5 + 3*j}, true},
		{"promised more since", 5, 5 + j + 10, 5 + 3*j, []uint64{5 + j, 5 + 2*j + 10, 5 + 3*j}, true},
		{"beyond the gap", 5, 5, 5 + datadir.MaxEpochGap + j + 1, []uint64{5 + datadir.MaxEpochGap + j + 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &jumpingNode{promised: tc.promised}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			g := grpc.NewServer()
			walshipv1.RegisterEpochServiceServer(g, n)
			go func() { _ = g.Serve(lis) }()
			defer g.Stop()
			req := &walshipv1.FenceRequest{Epoch: tc.epoch, CandidateId: "n1", CandidateAddr: "n1:7401"}
			resp, err := fenceStepping(t.Context(), serve.Dialer{}, lis.Addr().String(), false, req, tc.surveyed)
			if tc.granted && (err != nil || !resp.GetGranted() || resp.GetEpoch() != tc.epoch) {
				t.Fatalf("fenceStepping = %v, %v; want epoch %d granted", resp, err, tc.epoch)
			}
			if !tc.granted && status.Code(err) != codes.InvalidArgument {
				t.Fatalf("fenceStepping = %v, %v; want the node's INVALID_ARGUMENT", resp, err)
			}
			n.mu.Lock()
			defer n.mu.Unlock()
			if !slices.Equal(n.asked, tc.asked) {
				t.Fatalf("fenced %v; want %v", n.asked, tc.asked)
			}
		})
	}
}
