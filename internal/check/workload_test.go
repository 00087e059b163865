package check

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startCluster(t *testing.T, replicas int) *cluster.Cluster {
	t.Helper()
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: replicas})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// TestWorkloadIsLinearizable runs the workload against an in-process
// cluster (real gRPC on loopback), its replica reads included, and checks
// the history.
func TestWorkloadIsLinearizable(t *testing.T) {
	c := startCluster(t, 1)
	w := Workload{
		Primary: walshipv1.NewKVServiceClient(c.Conn(c.Primary)),
		Replica: walshipv1.NewKVServiceClient(c.Conn(c.Replicas[0])),
		Prefix:  "check/", KeyWindow: 500 * time.Millisecond,
	}
	h, session, err := w.Run(t.Context(), 2*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := Check(h, time.Minute)
	t.Log(res)
	if !res.OK() || res.Reads == 0 || res.Writes == 0 || res.Keys < 10 {
		t.Fatalf("%s\n%v", res, res.Violations())
	}
	if session.Reads == 0 || len(session.Violations) > 0 {
		t.Fatalf("replica reads: %d, violations %v", session.Reads, session.Violations)
	}
}

// TestCheckerRejectsAStaleServer: the same workload against a server that
// serves every read one write behind — a real gRPC KVService in front of
// a real primary, answering a read with the value the key held before its
// latest acknowledged write — must be found out.
func TestCheckerRejectsAStaleServer(t *testing.T) {
	c := startCluster(t, 0)
	stale := &staleServer{next: walshipv1.NewKVServiceClient(c.Conn(c.Primary)), prev: map[string]register{}, cur: map[string]register{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	walshipv1.RegisterKVServiceServer(g, stale)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	w := Workload{Primary: walshipv1.NewKVServiceClient(conn), Prefix: "stale/", KeyWindow: 500 * time.Millisecond}
	h, _, err := w.Run(t.Context(), time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := Check(h, time.Minute)
	t.Log(res)
	if res.Verdict != "Illegal" || len(res.Violations()) == 0 {
		t.Fatalf("a server one write behind passed: %s", res)
	}
	t.Log(res.Violations()[0])
}

// staleServer forwards writes to a real primary and answers reads with
// the value each key held before the latest write it forwarded.
type staleServer struct {
	walshipv1.UnimplementedKVServiceServer
	next walshipv1.KVServiceClient

	mu        sync.Mutex
	prev, cur map[string]register
}

func (s *staleServer) wrote(key string, r register) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prev[key], s.cur[key] = s.cur[key], r
}

func (s *staleServer) read(key string) register {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prev[key]
}

func (s *staleServer) Put(ctx context.Context, req *walshipv1.PutRequest) (*walshipv1.PutResponse, error) {
	resp, err := s.next.Put(ctx, req)
	if err == nil {
		s.wrote(req.Key, register{present: true, value: string(req.Value)})
	}
	return resp, err
}

func (s *staleServer) Delete(ctx context.Context, req *walshipv1.DeleteRequest) (*walshipv1.DeleteResponse, error) {
	resp, err := s.next.Delete(ctx, req)
	if err == nil {
		s.wrote(req.Key, register{})
	}
	return resp, err
}

func (s *staleServer) Get(ctx context.Context, req *walshipv1.GetRequest) (*walshipv1.GetResponse, error) {
	if _, err := s.next.Get(ctx, req); err != nil {
		return nil, err
	}
	r := s.read(req.Key)
	return &walshipv1.GetResponse{Found: r.present, Value: []byte(r.value)}, nil
}

func (s *staleServer) Txn(ctx context.Context, req *walshipv1.TxnRequest) (*walshipv1.TxnResponse, error) {
	resp, err := s.next.Txn(ctx, req)
	if err != nil || len(req.Success) != 1 {
		return resp, err
	}
	switch op := req.Success[0].Op.(type) {
	case *walshipv1.TxnOp_Get:
		r := s.read(op.Get.Key)
		resp.Results[0] = &walshipv1.TxnOpResult{Result: &walshipv1.TxnOpResult_Get{Get: &walshipv1.GetOpResult{Found: r.present, Value: []byte(r.value)}}}
	case *walshipv1.TxnOp_Put:
		if resp.Succeeded {
			s.wrote(op.Put.Key, register{present: true, value: string(op.Put.Value)})
		}
	}
	return resp, nil
}
