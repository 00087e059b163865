package node

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/watermark"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/primary"
)

// memElection is an election in memory, for the rules of auto.go alone
// (internal/e2e runs them against a real Kubernetes API server).
type memElection struct {
	id string

	mu                  sync.Mutex
	holder              string
	campaigns, releases int
	labels              []string // "role reads" of each Label call (reads "?" when left)
	renewals            watermark.Watermark
}

func (e *memElection) Campaign(ctx context.Context, _ bool, lead func(context.Context)) error {
	e.mu.Lock()
	e.campaigns++
	e.mu.Unlock()
	for {
		e.mu.Lock()
		if e.holder == "" || e.holder == e.id {
			e.holder = e.id
			e.mu.Unlock()
			e.renewals.Advance(e.renewals.Load() + 1)
			break
		}
		e.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(10 * time.Millisecond):
		}
	}
	lctx, cancel := context.WithCancel(ctx)
	go lead(lctx)
	<-ctx.Done()
	cancel()
	e.mu.Lock()
	e.holder = ""
	e.releases++
	e.mu.Unlock()
	return nil
}

func (e *memElection) Held() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.holder == e.id
}

func (e *memElection) Renewed() <-chan struct{} {
	_, ch := e.renewals.Changed()
	return ch
}

func (e *memElection) TakeOver(context.Context) error {
	e.mu.Lock()
	e.holder = e.id
	e.mu.Unlock()
	e.renewals.Advance(e.renewals.Load() + 1)
	return nil
}

func (e *memElection) Label(_ context.Context, role string, reads *bool) error {
	r := "?"
	if reads != nil {
		r = fmt.Sprint(*reads)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.labels = append(e.labels, role+" "+r)
	return nil
}

// lastLabel is the last Label call's "role reads" ("" before any).
func (e *memElection) lastLabel() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.labels) == 0 {
		return ""
	}
	return e.labels[len(e.labels)-1]
}

func (e *memElection) Event(context.Context, string, string, string) {}
func (e *memElection) Exists(context.Context) (bool, error)          { return false, nil }

func (e *memElection) counts() (campaigns, releases int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.campaigns, e.releases
}

// TestPrimaryWithoutLogStoresGivesTheElectionUp: a primary that holds
// the election takes writes only while it does; cut off from its log
// stores it gives the election up (within 8 retry periods) and does not
// contend again until it hears from them, so that a replica that reaches
// them could promote.
func TestPrimaryWithoutLogStoresGivesTheElectionUp(t *testing.T) {
	dir := t.TempDir()
	lcfg := logstore.DefaultConfig()
	lcfg.Listen, lcfg.MetricsListen, lcfg.DataDir = "127.0.0.1:0", "", filepath.Join(dir, "ls")
	lcfg.StopTimeout = time.Second
	ls, err := logstore.New(lcfg)
	if err != nil {
		t.Fatal(err)
	}
	lsRun := run(t, ls.Run)
	c := &cluster{dir: dir, ls: ls.Addr(), nodes: map[string]*Node{}, runs: map[string]*running{},
		members: []primary.Member{{ID: "n0", Addr: testkit.FreeAddr(t)}}}
	cfg := c.config("n0", RolePrimary)
	cfg.Primary.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED
	el := &memElection{id: "n0"}
	cfg.Election, cfg.ElectionRetry = el, 20*time.Millisecond
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.nodes["n0"] = n
	run(t, n.Run)
	conn := c.conn(t, "n0")
	testkit.Until(t, "the primary to take writes", func() bool { return n.Primary() != nil && n.Primary().TakingWrites() })
	put(t, conn, "k", "v")
	// Without the election, no writes.
	el.mu.Lock()
	el.holder = "someone-else"
	el.mu.Unlock()
	testkit.Until(t, "the primary to stop taking writes", func() bool { return !n.Primary().TakingWrites() })
	el.mu.Lock()
	el.holder = "n0"
	el.mu.Unlock()
	testkit.Until(t, "the primary to take writes again", func() bool { return n.Primary().TakingWrites() })
	// Cut off from the log store: it gives the election up and stays out.
	if err := lsRun.stop(t); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "the election given up", func() bool { _, r := el.counts(); return r >= 1 })
	campaigns, _ := el.counts()
	if n.Primary().HasLease() {
		t.Fatal("gave the election up while it had its lease")
	}
	// Nothing to wait for but the absence of a campaign: 30 retry periods.
	<-time.After(30 * cfg.ElectionRetry)
	if got, _ := el.counts(); got != campaigns {
		t.Fatalf("a primary without its log stores contended again (%d campaigns, then %d)", campaigns, got)
	}
}
