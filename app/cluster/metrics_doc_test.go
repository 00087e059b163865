package cluster

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/replica"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestMetricsDocumented compares the walship_* metrics every service
// registers, gathered from a cluster that did some work, with the tables of
// docs/METRICS.md, both ways.
func TestMetricsDocumented(t *testing.T) {
	// Over mTLS, so that the TLS and authorization metrics are registered
	// too, with one refused call.
	tlsDir := t.TempDir()
	sec, err := DevTLS(tlsDir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	// With an archive (uploaded by the log store, read by the replica)
	// and automatic failover on the log stores' election, so that their
	// metrics are registered too.
	archiveDir := t.TempDir()
	c := startCluster(t, Config{LogStores: 1, Replicas: 1, Security: sec, Failover: true, AutoFailover: true, LogStore: func(_ int, l *logstore.Config) {
		l.Archive = logstore.ArchiveOptions{Config: archive.Config{URL: "file://" + archiveDir}, Interval: 20 * time.Millisecond}
	}, Replica: func(_ int, r *replica.Config) { r.Archive = archive.Config{URL: "file://" + archiveDir} }})
	randomLoad(t, walshipv1.NewKVServiceClient(c.Conn(c.Primary)), 2, 20, nil)
	waitConverged(t, c)
	refuseOneCall(t, tlsDir, c.Primary.Addr)
	testkit.Until(t, "the primary to report the archive", func() bool {
		st, err := c.Status(t.Context(), c.Primary)
		return err == nil && st.GetArchive().GetArchivedLsn() > 0
	})

	registered := map[string]string{} // name -> node that registered it
	for _, n := range c.Nodes() {
		mfs, err := n.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), "walship_") {
				registered[mf.GetName()] = n.Name
			}
		}
	}
	doc, err := os.ReadFile("../../docs/METRICS.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	row := regexp.MustCompile("(?m)^\\| `(walship_[a-z0-9_]+)` \\|")
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	var missing, stale []string
	for name, node := range registered {
		if !documented[name] {
			missing = append(missing, name+" (registered by "+node+")")
		}
	}
	for name := range documented {
		if _, ok := registered[name]; !ok {
			stale = append(stale, name)
		}
	}
	sort.Strings(missing)
	sort.Strings(stale)
	if len(missing) > 0 {
		t.Errorf("registered but not in docs/METRICS.md:\n  %s", strings.Join(missing, "\n  "))
	}
	if len(stale) > 0 {
		t.Errorf("in docs/METRICS.md but registered by no service:\n  %s", strings.Join(stale, "\n  "))
	}
	if len(documented) < 30 {
		t.Fatalf("found only %d documented metrics: is the table format of docs/METRICS.md still | `name` | ... |?", len(documented))
	}
}

// refuseOneCall asks addr for SetPolicy as DevTLS's client, which the
// default policy refuses.
func refuseOneCall(t *testing.T, tlsDir, addr string) {
	t.Helper()
	src, err := tlsid.Load(tlsid.Files{Cert: filepath.Join(tlsDir, "client.crt"), Key: filepath.Join(tlsDir, "client.key"), CA: filepath.Join(tlsDir, "ca.crt")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(src.Credentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := walshipv1.NewAdminServiceClient(conn).SetPolicy(ctx, &walshipv1.SetPolicyRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a client's SetPolicy: %v; want PERMISSION_DENIED", err)
	}
}
