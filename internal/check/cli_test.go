package check_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/walship/walship/app/cli"
	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/check"
	"google.golang.org/grpc"
)

// TestCheckLinearFindsAStaleServer: `walship check linear` pointed at a
// server that serves reads one write behind (in front of a real primary,
// whose Status it passes through) prints NOT LINEARIZABLE, writes the
// history and porcupine's visualisation, and exits 1.
func TestCheckLinearFindsAStaleServer(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	walshipv1.RegisterKVServiceServer(g, check.NewStaleServer(walshipv1.NewKVServiceClient(c.Conn(c.Primary))))
	walshipv1.RegisterAdminServiceServer(g, adminProxy{next: walshipv1.NewAdminServiceClient(c.Conn(c.Primary))})
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)

	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := cli.Main(context.Background(), []string{"check", "linear", "--primary", lis.Addr().String(), "--duration", "1s",
		"--rate", "2000", "--out", out}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stdout.String(), "NOT LINEARIZABLE: ") || !strings.Contains(stdout.String(), "visualisation: ") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	h, err := check.Load(filepath.Join(out, "history.json"))
	if err != nil {
		t.Fatal(err)
	}
	if res := check.Check(h, 0); res.OK() {
		t.Fatalf("the saved history checks out: %s", res)
	}
	if fi, err := os.Stat(filepath.Join(out, "history.html")); err != nil || fi.Size() == 0 {
		t.Fatalf("visualisation: %v", err)
	}
}

// adminProxy passes Status through to the real primary.
type adminProxy struct {
	walshipv1.UnimplementedAdminServiceServer
	next walshipv1.AdminServiceClient
}

func (a adminProxy) Status(ctx context.Context, req *walshipv1.StatusRequest) (*walshipv1.StatusResponse, error) {
	return a.next.Status(ctx, req)
}
