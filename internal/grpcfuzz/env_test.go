package grpcfuzz

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
	"google.golang.org/grpc"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// trustDomain is the harness's, as `walship dev --tls` has its own.
const trustDomain = cluster.DevTrustDomain

// class is a kind of certificate a caller holds.
type class uint8

const (
	classNode     class = iota // spiffe://TD/walship/node/fuzz
	classLogStore              // spiffe://TD/walship/logstore/fuzz
	classClient                // spiffe://TD/walship/client/fuzz
	classAdmin                 // spiffe://TD/walship/admin/fuzz
	classNoID                  // signed by the cluster's CA, no URI SAN at all
	classForeign               // an admin of another trust domain, same CA
	numClasses
)

func (c class) String() string {
	return [...]string{"node", "logstore", "client", "admin", "no-identity", "foreign"}[c%numClasses]
}

// spiffeClass is the class name the default policy knows c by ("" for
// none).
func (c class) spiffeClass() string {
	switch c {
	case classNode:
		return tlsid.ClassNode
	case classLogStore:
		return tlsid.ClassLogStore
	case classClient:
		return tlsid.ClassClient
	case classAdmin:
		return tlsid.ClassAdmin
	}
	return ""
}

// target is a server the harness drives, by its index in env.nodes.
type target uint8

const (
	targetLogStore target = iota
	targetPrimary         // the data node "primary": the primary until a promotion moves the role
	targetReplica         // the data node "replica-0"
	numTargets
)

// env is a running cluster — one log store, a primary and a replica
// following it, members of one cluster (failover on), served over mTLS
// under the default authorization policy as `walship dev --tls` serves
// them — and a client connection to each server as each class.
type env struct {
	dir     string
	cluster *cluster.Cluster
	nodes   [numTargets]*cluster.Node
	conns   [numClasses][numTargets]*grpc.ClientConn
	// methods are every method any server registers, by full name.
	methods map[string]protoreflect.MethodDescriptor
	// served says which methods each server registers: for a data node,
	// either role's (a promotion or a switchover swaps them).
	served [numTargets]map[string]bool
	// allowed is, per method, the classes the default policy lets call it.
	allowed map[string][numClasses]bool
	// clusterID is the cluster's id once the primary made one.
	clusterID string
	// policy is the primary's default commit policy at start, which a
	// repair puts back.
	policy *walshipv1.CommitPolicy
	// logs keeps the cluster's newest log lines, to explain a finding.
	logs *logBuffer
	// sec and files are the servers' security and each class's
	// certificate files, kept to start a new cluster.
	sec   serve.Security
	files [numClasses]tlsid.Files
	// maxBytes bounds the huge fields the mutator builds.
	maxBytes int
	// generation counts the clusters started (a finding that leaves one
	// broken starts the next in a new directory).
	generation int
}

// startEnv starts the cluster in dir, makes certificates of every class
// from the cluster's CA and connects as each.
func startEnv(dir string, maxBytes int) (_ *env, err error) {
	e := &env{dir: dir, logs: newLogBuffer(200), maxBytes: maxBytes}
	defer func() {
		if err != nil {
			_ = e.stop()
		}
	}()
	certs := filepath.Join(e.dir, "tls")
	ca, err := tlsid.NewCA("grpcfuzz CA", 24*time.Hour)
	if err != nil {
		return nil, err
	}
	local := []net.IP{net.ParseIP("127.0.0.1")}
	if err := os.MkdirAll(certs, 0o700); err != nil {
		return nil, err
	}
	for c := range numClasses {
		leaf := tlsid.Leaf{URI: tlsid.URI(trustDomain, c.spiffeClass(), "fuzz"), IPs: local}
		switch c {
		case classNoID:
			leaf = tlsid.Leaf{IPs: local}
		case classForeign:
			leaf.URI = tlsid.URI("other.example", tlsid.ClassAdmin, "fuzz")
		}
		if e.files[c], err = ca.WriteFiles(certs, c.String(), leaf); err != nil {
			return nil, err
		}
	}
	// The servers' security, as cluster.DevTLS makes it: every node (log
	// stores too) holds a node certificate and dials with it.
	nodeSrc, err := tlsid.Load(e.files[classNode], nil)
	if err != nil {
		return nil, err
	}
	az, err := tlsid.NewAuthz(tlsid.AuthzConfig{TrustDomain: trustDomain, Reflection: tlsid.ReflectionAll})
	if err != nil {
		return nil, err
	}
	if e.allowed, err = policyTable(tlsid.DefaultPolicy(trustDomain, tlsid.ReflectionAll)); err != nil {
		return nil, err
	}
	e.sec = serve.Security{TLS: nodeSrc, Authz: az, Dialer: serve.NewDialer(nodeSrc, "")}
	if err := e.start(); err != nil {
		return nil, err
	}
	if err := e.discover(); err != nil {
		return nil, err
	}
	return e, nil
}

// start starts a new cluster in a new directory (the first, or one that
// replaces a cluster a finding left broken) and connects to it as each
// class.
func (e *env) start() error {
	e.generation++
	quick := func(hb *time.Duration, stop *time.Duration) { *hb, *stop = 100*time.Millisecond, 5*time.Second }
	c, err := cluster.Start(context.Background(), cluster.Config{
		Dir: filepath.Join(e.dir, fmt.Sprintf("cluster-%d", e.generation)), LogStores: 1, Replicas: 1, Failover: true, Security: e.sec,
		Logger: e.logs.logger(),
		Primary: func(c *primary.Config) {
			quick(&c.HeartbeatInterval, &c.StopTimeout)
			c.SegmentBytes = 1 << 20
		},
		Replica: func(_ int, c *replica.Config) {
			quick(&c.HeartbeatInterval, &c.StopTimeout)
			c.SegmentBytes = 1 << 20
		},
		LogStore: func(_ int, c *logstore.Config) { c.SegmentBytes = 1 << 20 },
	})
	if err != nil {
		return err
	}
	e.cluster = c
	e.nodes = [numTargets]*cluster.Node{c.LogStores[0], c.Primary, c.Replicas[0]}
	st, err := c.Status(context.Background(), c.Primary)
	if err != nil {
		return err
	}
	e.clusterID, e.policy = st.GetClusterId(), st.GetDefaultPolicy()
	for c := range numClasses {
		src, err := tlsid.Load(e.files[c], nil)
		if err != nil {
			return err
		}
		for n := range numTargets {
			// Receive anything: the harness judges what a server sends, it
			// does not refuse it.
			conn, err := grpc.NewClient(e.nodes[n].Addr, grpc.WithTransportCredentials(src.Credentials()),
				grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30), grpc.MaxCallSendMsgSize(1<<30)))
			if err != nil {
				return err
			}
			e.conns[c][n] = conn
		}
	}
	return nil
}

// stop closes the connections and stops the cluster, and makes the
// process dial in plaintext again.
func (e *env) stop() error {
	for c := range numClasses {
		for n := range numTargets {
			if e.conns[c][n] != nil {
				e.conns[c][n].Close()
				e.conns[c][n] = nil
			}
		}
	}
	var err error
	if e.cluster != nil {
		err = e.cluster.Stop()
		e.cluster = nil
	}
	return err
}

// restart replaces the cluster with a new one (after a finding that left
// it broken: its stop error is part of that finding, not returned).
func (e *env) restart() error {
	for c := range numClasses {
		for n := range numTargets {
			if e.conns[c][n] != nil {
				e.conns[c][n].Close()
				e.conns[c][n] = nil
			}
		}
	}
	if e.cluster != nil {
		_ = e.cluster.Stop()
		e.cluster = nil
	}
	return e.start()
}

// discover asks every server's reflection (as an admin) which services it
// serves and finds their methods in the process's registry (the servers
// run here, so every descriptor they serve is linked in): a method added
// later is driven without a change here.
func (e *env) discover() error {
	e.methods = map[string]protoreflect.MethodDescriptor{}
	for n := range numTargets {
		e.served[n] = map[string]bool{}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := reflectionv1.NewServerReflectionClient(e.conns[classAdmin][n]).ServerReflectionInfo(ctx)
		if err != nil {
			cancel()
			return fmt.Errorf("%s: reflection: %w", e.nodes[n].Name, err)
		}
		err = st.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}})
		resp, rerr := st.Recv()
		cancel()
		if err != nil || rerr != nil {
			return fmt.Errorf("%s: reflection: list services: %w", e.nodes[n].Name, errors.Join(err, rerr))
		}
		for _, s := range resp.GetListServicesResponse().GetService() {
			d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(s.GetName()))
			if err != nil {
				return fmt.Errorf("%s serves %s, which this process does not know: %w", e.nodes[n].Name, s.GetName(), err)
			}
			sd := d.(protoreflect.ServiceDescriptor)
			for i := range sd.Methods().Len() {
				md := sd.Methods().Get(i)
				full := "/" + string(sd.FullName()) + "/" + string(md.Name())
				e.methods[full] = md
				e.served[n][full] = true
			}
		}
	}
	for m := range e.served[targetPrimary] {
		e.served[targetReplica][m] = true
	}
	for m := range e.served[targetReplica] {
		e.served[targetPrimary][m] = true
	}
	for _, want := range []string{"/grpc.health.v1.Health/Check", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
		"/walship.v1.KVService/Put", "/walship.v1.LogStoreService/Append", "/walship.v1.AdminService/Promote"} {
		if e.methods[want] == nil {
			return fmt.Errorf("reflection did not list %s: discovery is broken", want)
		}
	}
	return nil
}

// policyTable reads an A43 policy (the default policy's JSON) into, per
// method, the classes it allows: a call by any other class must be
// refused. Methods no rule names are allowed to nobody.
func policyTable(policy string) (map[string][numClasses]bool, error) {
	var p struct {
		Allow []struct {
			Source *struct {
				Principals []string `json:"principals"`
			} `json:"source"`
			Request struct {
				Paths []string `json:"paths"`
			} `json:"request"`
		} `json:"allow_rules"`
	}
	if err := json.Unmarshal([]byte(policy), &p); err != nil {
		return nil, err
	}
	allowedBy := func(principals []string, c class) bool {
		for _, pr := range principals {
			if c.spiffeClass() != "" && c != classForeign && pr == tlsid.URI(trustDomain, c.spiffeClass(), "*") {
				return true
			}
		}
		return false
	}
	out := map[string][numClasses]bool{}
	for _, r := range p.Allow {
		for _, path := range r.Request.Paths {
			row := out[path]
			for c := range numClasses {
				if r.Source == nil || allowedBy(r.Source.Principals, c) {
					row[c] = true
				}
			}
			out[path] = row
		}
	}
	return out, nil
}

// mayCall reports whether the default policy lets c call method.
func (e *env) mayCall(c class, method string) bool {
	var row [numClasses]bool
	for path, r := range e.allowed {
		if path == method || (strings.HasSuffix(path, "/*") && strings.HasPrefix(method, strings.TrimSuffix(path, "*"))) {
			for i := range r {
				row[i] = row[i] || r[i]
			}
		}
	}
	return row[c]
}

// status is the AdminService status of server n, as an admin.
func (e *env) status(ctx context.Context, n target) (*walshipv1.StatusResponse, error) {
	return walshipv1.NewAdminServiceClient(e.conns[classAdmin][n]).Status(ctx, &walshipv1.StatusRequest{})
}

// String names a target.
func (e *env) name(n target) string {
	if n < numTargets && e.nodes[n] != nil {
		return e.nodes[n].Name
	}
	return fmt.Sprintf("target %d", n)
}
