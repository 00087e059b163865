// Package cluster runs a whole walship deployment — log stores, a primary
// and replicas — inside one process, on loopback. It is what `walship dev`
// and `walship bench` start, and what the replication tests drive: the same
// services as separate processes would run, talking real gRPC to each other.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/freeport"
	"github.com/walship/walship/internal/logelect"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/node"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Config describes a cluster.
type Config struct {
	// Dir is the root of every node's data directory.
	Dir string
	// LogStores and Replicas are how many of each to run.
	LogStores, Replicas int
	// Host is the address nodes listen on, e.g. "127.0.0.1".
	Host string
	// BasePort, if not 0, gives fixed ports, the CLI's defaults for
	// BasePort 7400: the first log store at BasePort, the primary at
	// BasePort+1, replicas from BasePort+2, further log stores after the
	// replicas; metrics at the same ports +2000 (9400...). 0 picks free
	// ports, with metrics listeners only if Metrics is set.
	BasePort int
	// Metrics enables the /metrics listeners.
	Metrics bool
	// Primary, Replica and LogStore adjust each node's config before it starts.
	Primary  func(*primary.Config)
	Replica  func(i int, c *replica.Config)
	LogStore func(i int, c *logstore.Config)
	// Logger is the parent logger (each node adds its name).
	Logger *slog.Logger
	// Failover makes the data nodes members of one cluster (primary,
	// replica-0, ...): a replica can then be promoted by an epoch vote
	// (AdminService.Promote), and every epoch starts with its epoch record.
	Failover bool
	// AutoFailover makes every data node fail over by itself, on the log
	// stores' election (internal/logelect) with its shipped defaults and
	// node.DefaultFailoverHolddown (needs Failover).
	AutoFailover bool
	// Security is every server's TLS and authorization (zero: plaintext);
	// the nodes dial with Security.Dialer, and so does Conn.
	Security serve.Security
}

// Node is one running service.
type Node struct {
	Name        string
	Addr        string
	MetricsAddr string
	Registry    *prometheus.Registry

	run    func(context.Context) error
	node   *node.Node // a data node's supervisor (nil for a log store)
	cancel context.CancelFunc
	done   chan error
}

// Cluster is a running cluster.
type Cluster struct {
	cfg       Config
	LogStores []*Node
	Primary   *Node
	Replicas  []*Node

	// lsListen are the log stores' listen addresses, known before any
	// starts when there are several: each is given the others as peers.
	lsListen []string

	// members are the data nodes' ids and addresses (Failover).
	members []primary.Member

	mu    sync.Mutex
	conns []*grpc.ClientConn
}

// Start starts the log stores, the primary, then the replicas, and returns
// once every node reports SERVING.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{cfg: cfg}
	ok := false
	defer func() {
		if !ok {
			// A node made but not started holds its listeners: run it,
			// so that Stop closes them (a later Start on the same ports
			// would find them taken).
			for _, n := range c.Nodes() {
				if n.Stopped() {
					n.start()
				}
			}
			_ = c.Stop()
		}
	}()
	var lsAddrs []string
	var err error
	for i := 0; i < cfg.LogStores; i++ {
		addr, _ := c.logStoreAddr(i)
		if cfg.BasePort == 0 && cfg.LogStores > 1 {
			// Known before any log store binds, and bound again by a
			// restart: outside the ephemeral range.
			if addr, err = freeport.Pick(cfg.Host); err != nil {
				return nil, err
			}
		}
		c.lsListen = append(c.lsListen, addr)
	}
	for i := 0; i < cfg.LogStores; i++ {
		n, err := c.newLogStore(i)
		if err != nil {
			return nil, err
		}
		c.LogStores = append(c.LogStores, n)
		lsAddrs = append(lsAddrs, n.Addr)
	}
	if cfg.AutoFailover {
		// A data node asks the log stores' election whether the cluster
		// exists before it bootstraps: they must serve first.
		for _, n := range c.LogStores {
			n.start()
		}
		for _, n := range c.LogStores {
			if err := c.WaitServing(ctx, n); err != nil {
				return nil, err
			}
		}
	}
	if cfg.Failover {
		c.members = append(c.members, primary.Member{ID: "primary"})
		for i := 0; i < cfg.Replicas; i++ {
			c.members = append(c.members, primary.Member{ID: fmt.Sprintf("replica-%d", i)})
		}
		for i := range c.members {
			if cfg.BasePort != 0 {
				c.members[i].Addr, _ = c.addr(1 + i)
			} else if c.members[i].Addr, err = freeport.Pick(cfg.Host); err != nil {
				return nil, err
			}
		}
	}
	pn, err := c.newPrimary(lsAddrs)
	if err != nil {
		return nil, err
	}
	c.Primary = pn
	for i := 0; i < cfg.Replicas; i++ {
		rn, err := c.newReplica(i)
		if err != nil {
			return nil, err
		}
		c.Replicas = append(c.Replicas, rn)
	}
	for _, n := range c.Nodes() {
		if n.Stopped() {
			n.start()
		}
	}
	for _, n := range c.Nodes() {
		if err := c.WaitServing(ctx, n); err != nil {
			return nil, err
		}
	}
	if cfg.AutoFailover {
		// Serving is not yet taking writes: the primary first wins the
		// election it creates.
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := c.waitTakingWrites(wctx, c.Primary)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	ok = true
	return c, nil
}

func (c *Cluster) addr(offset int) (grpcAddr, metricsAddr string) {
	if c.cfg.BasePort == 0 {
		grpcAddr = c.cfg.Host + ":0"
		if c.cfg.Metrics {
			metricsAddr = c.cfg.Host + ":0"
		}
		return
	}
	return fmt.Sprintf("%s:%d", c.cfg.Host, c.cfg.BasePort+offset), fmt.Sprintf("%s:%d", c.cfg.Host, c.cfg.BasePort+2000+offset)
}

// logStoreAddr is where log store i listens with fixed ports (the first
// at BasePort, the others after the replicas).
func (c *Cluster) logStoreAddr(i int) (grpcAddr, metricsAddr string) {
	if i == 0 {
		return c.addr(0)
	}
	return c.addr(1 + c.cfg.Replicas + i)
}

func (c *Cluster) newLogStore(i int) (*Node, error) {
	_, metrics := c.logStoreAddr(i)
	return c.newLogStoreAt(i, c.lsListen[i], metrics)
}

// LogStoreDir is log store i's data directory (a test empties it to
// stand for a lost disk).
func (c *Cluster) LogStoreDir(i int) string {
	return filepath.Join(c.cfg.Dir, fmt.Sprintf("logstore-%d", i))
}

func (c *Cluster) newLogStoreAt(i int, listen, metrics string) (*Node, error) {
	cfg := logstore.DefaultConfig()
	cfg.Listen, cfg.MetricsListen = listen, metrics
	cfg.DataDir = c.LogStoreDir(i)
	for j, addr := range c.lsListen {
		if j != i {
			cfg.Peers = append(cfg.Peers, addr)
		}
	}
	name := fmt.Sprintf("logstore-%d", i)
	cfg.Logger = c.cfg.Logger.With("node", name)
	cfg.Registry = serve.NewRegistry()
	cfg.Security = c.cfg.Security
	if c.cfg.LogStore != nil {
		c.cfg.LogStore(i, &cfg)
	}
	s, err := labeled(name, func() (*logstore.Server, error) { return logstore.New(cfg) })
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &Node{Name: name, Addr: s.Addr(), MetricsAddr: s.MetricsAddr(), Registry: cfg.Registry, run: s.Run}, nil
}

func (c *Cluster) newPrimary(logstores []string) (*Node, error) {
	listen, metrics := c.addr(1)
	if c.cfg.Failover && c.cfg.BasePort == 0 {
		listen = c.members[0].Addr
	}
	return c.newPrimaryAt(logstores, listen, metrics)
}

// primaryConfig is the primary role's config template.
func (c *Cluster) primaryConfig() primary.Config {
	cfg := primary.DefaultConfig()
	cfg.StopTimeout = 30 * time.Second
	cfg.Security = c.cfg.Security
	if c.cfg.Primary != nil {
		c.cfg.Primary(&cfg)
	}
	return cfg
}

// dataNode creates the data node id: the primary (i < 0) or replica i.
func (c *Cluster) dataNode(name string, role node.Role, i int, listen, metrics string, logstores []string) (*Node, error) {
	rc := c.replicaConfig(max(i, 0))
	pc := c.primaryConfig()
	rc.Listen, rc.MetricsListen = listen, metrics
	cfg := node.Config{ID: name, DataDir: filepath.Join(c.cfg.Dir, name), Listen: listen, MetricsListen: metrics,
		LogStores: logstores, Role: role, Primary: pc, Replica: rc, Registry: serve.NewRegistry(),
		Logger: c.cfg.Logger} // the node adds node=<id> to its logs itself
	if c.cfg.Failover {
		cfg.Members = c.members
	}
	if rc.Primary == "" && c.Primary != nil {
		cfg.Replica.Primary = c.Primary.Addr
	}
	closeElection := func() {}
	if c.cfg.AutoFailover {
		el, err := logelect.New(logelect.Config{ID: name, LogStores: logstores, LeaseDuration: logelect.DefaultLeaseDuration,
			RenewDeadline: logelect.DefaultRenewDeadline, RetryPeriod: logelect.DefaultRetryPeriod, Logger: c.cfg.Logger.With("node", name),
			Dialer: c.cfg.Security.Dialer})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		cfg.Election, cfg.ElectionRetry, cfg.FailoverHolddown = el, logelect.DefaultRetryPeriod, node.DefaultFailoverHolddown
		closeElection = func() { _ = el.Close() }
	}
	n, err := labeled(name, func() (*node.Node, error) { return node.New(cfg) })
	if err != nil {
		closeElection()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	run := func(ctx context.Context) error {
		defer closeElection()
		return n.Run(ctx)
	}
	return &Node{Name: name, Addr: n.Addr(), MetricsAddr: n.MetricsAddr(), Registry: cfg.Registry, run: run, node: n}, nil
}

func (c *Cluster) newPrimaryAt(logstores []string, listen, metrics string) (*Node, error) {
	return c.dataNode("primary", node.RolePrimary, -1, listen, metrics, logstores)
}

func (c *Cluster) replicaConfig(i int) replica.Config {
	cfg := replica.DefaultConfig()
	cfg.Listen, cfg.MetricsListen = c.addr(2 + i)
	if c.cfg.Failover && c.cfg.BasePort == 0 && 1+i < len(c.members) {
		cfg.Listen = c.members[1+i].Addr
	}
	cfg.ID = fmt.Sprintf("replica-%d", i)
	cfg.DataDir = filepath.Join(c.cfg.Dir, cfg.ID)
	if c.Primary != nil {
		cfg.Primary = c.Primary.Addr
	}
	cfg.LogStores = c.logStoreAddrs()
	cfg.Logger = c.cfg.Logger.With("node", cfg.ID)
	cfg.Registry = serve.NewRegistry()
	cfg.Security = c.cfg.Security
	if c.cfg.Replica != nil {
		c.cfg.Replica(i, &cfg)
	}
	return cfg
}

func (c *Cluster) newReplica(i int) (*Node, error) {
	cfg := c.replicaConfig(i)
	return c.dataNode(cfg.ID, node.RoleReplica, i, cfg.Listen, cfg.MetricsListen, c.logStoreAddrs())
}

func (c *Cluster) logStoreAddrs() []string {
	var ls []string
	for _, l := range c.LogStores {
		ls = append(ls, l.Addr)
	}
	return ls
}

func (n *Node) start() {
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan error, 1)
	// The label follows every goroutine the node starts (its gRPC servers'
	// and clients' included), so a CPU profile of an in-process cluster
	// (walship bench --cpuprofile) splits by node: pprof -tagfocus node=....
	go pprof.Do(ctx, pprof.Labels("node", n.Name), func(ctx context.Context) { n.done <- n.run(ctx) })
}

// labeled calls newServer under the pprof label node=name, as start runs
// the node: a gRPC server starts the stream workers that run its handlers
// when it is created, not when it serves, and a goroutine keeps the labels
// it was created with.
func labeled[S any](name string, newServer func() (S, error)) (s S, err error) {
	pprof.Do(context.Background(), pprof.Labels("node", name), func(context.Context) { s, err = newServer() })
	return s, err
}

// stop stops n gracefully and returns Run's error.
func (n *Node) stop() error {
	if n == nil || n.cancel == nil {
		return nil
	}
	n.cancel()
	n.cancel = nil
	return <-n.done
}

// Nodes returns every node: log stores, primary, replicas.
func (c *Cluster) Nodes() []*Node {
	var ns []*Node
	ns = append(ns, c.LogStores...)
	if c.Primary != nil {
		ns = append(ns, c.Primary)
	}
	return append(ns, c.Replicas...)
}

// Stop stops every node, replicas first, and returns their errors.
func (c *Cluster) Stop() error {
	var errs []error
	for i := len(c.Replicas) - 1; i >= 0; i-- {
		errs = append(errs, c.Replicas[i].stop())
	}
	errs = append(errs, c.Primary.stop())
	for _, n := range c.LogStores {
		errs = append(errs, n.stop())
	}
	c.mu.Lock()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
	c.mu.Unlock()
	return errors.Join(errs...)
}

// LogStoreAddrs are the log stores' addresses.
func (c *Cluster) LogStoreAddrs() []string { return c.logStoreAddrs() }

// StopReplica stops replica i gracefully.
func (c *Cluster) StopReplica(i int) error { return c.Replicas[i].stop() }

// RestartReplica starts replica i again on the same address and data.
func (c *Cluster) RestartReplica(ctx context.Context, i int) error {
	old := c.Replicas[i]
	if err := old.stop(); err != nil {
		return err
	}
	cfg := c.replicaConfig(i)
	n, err := c.dataNode(cfg.ID, node.RoleReplica, i, old.Addr, old.MetricsAddr, c.logStoreAddrs())
	if err != nil {
		return err
	}
	c.Replicas[i] = n
	n.start()
	return c.WaitServing(ctx, n)
}

// RestartLogStore restarts log store i on the same address and data
// directory, or starts it again there after StopNode.
func (c *Cluster) RestartLogStore(ctx context.Context, i int) error {
	old := c.LogStores[i]
	if err := old.stop(); err != nil {
		return err
	}
	n, err := c.newLogStoreAt(i, old.Addr, old.MetricsAddr)
	if err != nil {
		return err
	}
	c.LogStores[i] = n
	n.start()
	return c.WaitServing(ctx, n)
}

// RestartPrimary restarts the primary on the same address and data.
func (c *Cluster) RestartPrimary(ctx context.Context) error {
	old := c.Primary
	if err := old.stop(); err != nil {
		return err
	}
	n, err := c.newPrimaryAt(c.logStoreAddrs(), old.Addr, old.MetricsAddr)
	if err != nil {
		return err
	}
	c.Primary = n
	n.start()
	return c.WaitServing(ctx, n)
}

// StopNode stops n (a data node or a log store) gracefully.
func (c *Cluster) StopNode(n *Node) error { return n.stop() }

// Stopped reports whether n was stopped (StopNode) and not started again.
func (n *Node) Stopped() bool { return n.cancel == nil }

// RestartStopped starts every stopped node again on its address and
// data directory, and returns them once they serve. A data node starts in
// the role its vote says: a primary another node has since replaced
// rejoins as that node's replica.
func (c *Cluster) RestartStopped(ctx context.Context) ([]*Node, error) {
	var started []*Node
	for i, old := range c.LogStores {
		if !old.Stopped() {
			continue
		}
		n, err := c.newLogStoreAt(i, old.Addr, old.MetricsAddr)
		if err != nil {
			return started, err
		}
		c.LogStores[i] = n
		n.start()
		started = append(started, n)
	}
	if old := c.Primary; old != nil && old.Stopped() {
		n, err := c.newPrimaryAt(c.logStoreAddrs(), old.Addr, old.MetricsAddr)
		if err != nil {
			return started, err
		}
		c.Primary = n
		n.start()
		started = append(started, n)
	}
	for i, old := range c.Replicas {
		if !old.Stopped() {
			continue
		}
		n, err := c.dataNode(old.Name, node.RoleReplica, i, old.Addr, old.MetricsAddr, c.logStoreAddrs())
		if err != nil {
			return started, err
		}
		c.Replicas[i] = n
		n.start()
		started = append(started, n)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, n := range started {
		// A primary that was replaced starts as the primary its vote
		// says, learns of the newer epoch and restarts its server as a
		// replica on the same address: wait through that.
		for {
			err := c.WaitServing(ctx, n)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return started, err
			}
			t := time.NewTimer(50 * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
	}
	return started, nil
}

// DataNode is n's data node (nil for a log store).
func (n *Node) DataNode() *node.Node { return n.node }

// Conn returns a client connection to n (closed by Stop).
func (c *Cluster) Conn(n *Node) *grpc.ClientConn {
	conn, err := c.cfg.Security.Dialer.Dial(n.Addr)
	if err != nil {
		panic(fmt.Sprintf("cluster: dial %s: %v", n.Addr, err)) // addresses come from listeners we own
	}
	c.mu.Lock()
	c.conns = append(c.conns, conn)
	c.mu.Unlock()
	return conn
}

// WaitServing waits until n's health check reports SERVING.
func (c *Cluster) WaitServing(ctx context.Context, n *Node) error {
	conn := c.Conn(n)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("%s: health: %w", n.Name, err)
	}
	for {
		m, err := w.Recv()
		if err != nil {
			return fmt.Errorf("%s: not serving: %w", n.Name, err)
		}
		if m.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
}

// Status returns n's AdminService status.
func (c *Cluster) Status(ctx context.Context, n *Node) (*walshipv1.StatusResponse, error) {
	return walshipv1.NewAdminServiceClient(c.Conn(n)).Status(ctx, &walshipv1.StatusRequest{})
}

// PrimaryServer is the primary's server while the first primary holds
// that role, for tests that inspect it.
func (c *Cluster) PrimaryServer() *primary.Server { return c.Primary.node.Primary() }
