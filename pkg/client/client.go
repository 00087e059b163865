// Package client is the Go client of a walship cluster, for programs
// outside this repository. Given any list of the cluster's nodes it finds
// the primary — and finds it again after a failover or a switchover —
// sends writes and linearizable reads there, and reads its own writes on
// replicas with min_lsn.
//
// # Connect
//
// Give New every data node's address you know (a stale list will do: the
// client learns the primary's address from the nodes that answer). Over
// mutual TLS, name the files of a client certificate, its key and the CA
// bundle in Options.TLS; they are read again every
// TLSFiles.ReloadInterval, so a rotated certificate or bundle is used for
// the next connections without a restart:
//
//	cl, err := client.New([]string{"db-0:7401", "db-1:7401", "db-2:7401"}, client.Options{
//		TLS: &client.TLSFiles{Cert: "client.crt", Key: "client.key", CA: "ca.crt"},
//	})
//	defer cl.Close()
//
// # Write, and read your write
//
// Put, Delete and Txn go to the primary and return the commit's LSN. Get
// and Scan read on the primary, linearizably. GetReplica and ScanReplica
// read on a replica once it has applied an LSN — pass the one your write
// returned to read your own write there, off the primary:
//
//	lsn, err := cl.Put(ctx, "user/42", []byte("alice"), nil)
//	g, err := cl.GetReplica(ctx, "user/42", lsn) // g.Value == "alice"
//
// # Survive a failover
//
// A call is retried — on the primary the client finds again — for up to
// Options.Retry, but a write only when the cluster says it did not apply
// it: a node that is not the primary refused it, the primary refused it
// before sequencing it (it was opening its epoch, handing over in a
// switchover, had lost its lease, or was over a resource bound such as
// its in-flight commit bytes or the caller's byte-rate quota), or the
// call never reached a server. Any other failure of a write — a timeout, a
// broken connection, a primary that failed or stepped down with the write
// in flight — is reported as an *UnknownOutcomeError: the write may be
// committed, and a caller that needs to know reads it back (or makes its
// writes idempotent, e.g. with a Txn comparing a version). Reads change
// nothing, so a read that fails during a hand-over (refused, cut off,
// unavailable) is retried like a write the cluster did not apply.
package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/kvpipe"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// UnknownOutcomeError is a write whose outcome is unknown.
type UnknownOutcomeError struct {
	Err error
}

func (e *UnknownOutcomeError) Error() string {
	return "walship: outcome unknown (the write may be committed): " + e.Err.Error()
}

func (e *UnknownOutcomeError) Unwrap() error { return e.Err }

// Options configure a Client.
type Options struct {
	// DialOptions are used for every node (default: insecure transport,
	// or TLS's credentials when it is set), after a reconnect backoff of
	// 50 ms to 2 s that they may override with grpc.WithConnectParams.
	DialOptions []grpc.DialOption
	// Retry bounds how long a call keeps looking for the primary (default 10 s).
	Retry time.Duration
	// TLS, if set, connects with mutual TLS 1.3 from these files,
	// reloaded when they change. It takes precedence over transport
	// credentials in DialOptions.
	TLS *TLSFiles
	// Unary sends every call as a unary call of its own. By default Put,
	// Delete, Txn and Get (the primary's) go as operations of one
	// KVService.Pipeline stream per node, shared by every concurrent
	// caller: a busy client pays gRPC's per-call cost once per stream.
	// Each call is answered, retried and classified exactly as its unary
	// call is — its deadline and cancellation reach the server, a write
	// its caller gave up on has an unknown outcome — and a stream that
	// breaks gives each write in flight on it an *UnknownOutcomeError, as
	// a connection broken under a unary write does. A node that does not
	// serve Pipeline gets unary calls.
	Unary bool
}

// TLSFiles name the PEM files of a client's identity: in Kubernetes,
// files of a whole Secret volume (not a subPath mount: those never
// update).
type TLSFiles struct {
	// Cert is the client certificate chain, leaf first; Key its private
	// key; CA the bundle of CAs the servers' certificates chain to (old
	// and new during a CA rotation).
	Cert, Key, CA string
	// ReloadInterval is how often the files are read again (default
	// 10 s). New connections use the newest files that check out (the
	// key matches the certificate, which chains to the bundle); a bad or
	// half-written update keeps the last good one. The identity in the
	// certificate may not change.
	ReloadInterval time.Duration
}

// Client routes calls to a cluster's nodes. It is safe for concurrent use.
type Client struct {
	opts  Options
	nodes []string

	tls       *tlsid.Source  // nil without Options.TLS
	stopWatch func()         // ends the TLS reload goroutine
	watching  sync.WaitGroup // the TLS reload goroutine

	mu      sync.Mutex
	conns   map[string]*grpc.ClientConn
	muxes   map[string]*kvpipe.Mux // unless Options.Unary, one per node
	primary string                 // address of the primary, "" until found
}

// New returns a client of the cluster whose nodes (any of them: the
// primary, replicas, even a stale list) are at addrs.
func New(addrs []string, opts Options) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("walship client: no node address")
	}
	if opts.Retry <= 0 {
		opts.Retry = 10 * time.Second
	}
	c := &Client{opts: opts, nodes: append([]string(nil), addrs...), conns: map[string]*grpc.ClientConn{}, muxes: map[string]*kvpipe.Mux{}, stopWatch: func() {}}
	if opts.TLS != nil {
		f := *opts.TLS
		for _, n := range []struct{ field, path string }{{"Cert", f.Cert}, {"Key", f.Key}, {"CA", f.CA}} {
			if n.path == "" {
				return nil, fmt.Errorf("walship client: TLSFiles.%s: required (the certificate, its key and the CA bundle)", n.field)
			}
		}
		src, err := tlsid.Load(tlsid.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, nil)
		if err != nil {
			return nil, fmt.Errorf("walship client: TLS: %w", err)
		}
		every := f.ReloadInterval
		if every <= 0 {
			every = 10 * time.Second
		}
		ctx, cancel := context.WithCancel(context.Background())
		c.tls, c.stopWatch = src, cancel
		c.watching.Add(1)
		go func() {
			defer c.watching.Done()
			src.Watch(ctx, every)
		}()
		// Last, so that it wins over credentials in DialOptions.
		c.opts.DialOptions = append(append([]grpc.DialOption(nil), opts.DialOptions...), grpc.WithTransportCredentials(src.Credentials()))
	} else if opts.DialOptions == nil {
		c.opts.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	// First, so that the caller's own connect parameters win.
	c.opts.DialOptions = append([]grpc.DialOption{backoff.Connect}, c.opts.DialOptions...)
	return c, nil
}

// Close closes every connection and stops reloading the TLS files.
func (c *Client) Close() error {
	c.stopWatch()
	c.watching.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.muxes {
		m.Close()
	}
	c.muxes = map[string]*kvpipe.Mux{}
	var errs []error
	for _, conn := range c.conns {
		errs = append(errs, conn.Close())
	}
	c.conns = map[string]*grpc.ClientConn{}
	return errors.Join(errs...)
}

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if conn, ok := c.conns[addr]; ok {
		return conn, nil
	}
	conn, err := grpc.NewClient(addr, c.opts.DialOptions...)
	if err != nil {
		return nil, err
	}
	c.conns[addr] = conn
	return conn, nil
}

// kv is the KVService client of the node at addr over conn: its
// pipeline unless Options.Unary (or it does not serve one).
func (c *Client) kv(addr string, conn *grpc.ClientConn) walshipv1.KVServiceClient {
	kv := walshipv1.NewKVServiceClient(conn)
	if c.opts.Unary {
		return kv
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.muxes[addr]
	if !ok {
		m = kvpipe.NewMux(kv)
		c.muxes[addr] = m
	}
	if m == nil {
		return kv
	}
	return unaryIfUnimplemented{m: m, kv: kv, off: func() {
		c.mu.Lock()
		if c.muxes[addr] == m {
			c.muxes[addr] = nil // Close closes it
			defer m.Close()
		}
		c.mu.Unlock()
	}}
}

// unaryIfUnimplemented sends through a node's pipeline, and as unary
// calls once the node says it has none (an older walship): an operation
// of a stream the node refused as UNIMPLEMENTED never ran.
type unaryIfUnimplemented struct {
	m   *kvpipe.Mux
	kv  walshipv1.KVServiceClient
	off func()
}

func fallBack[Req, Resp any](x unaryIfUnimplemented, ctx context.Context, in Req, piped, unary func(context.Context, Req, ...grpc.CallOption) (Resp, error)) (Resp, error) {
	r, err := piped(ctx, in)
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unimplemented && strings.Contains(st.Message(), "Pipeline") {
		x.off()
		return unary(ctx, in)
	}
	return r, err
}

func (x unaryIfUnimplemented) Put(ctx context.Context, in *walshipv1.PutRequest, _ ...grpc.CallOption) (*walshipv1.PutResponse, error) {
	return fallBack(x, ctx, in, x.m.Put, x.kv.Put)
}

func (x unaryIfUnimplemented) Delete(ctx context.Context, in *walshipv1.DeleteRequest, _ ...grpc.CallOption) (*walshipv1.DeleteResponse, error) {
	return fallBack(x, ctx, in, x.m.Delete, x.kv.Delete)
}

func (x unaryIfUnimplemented) Txn(ctx context.Context, in *walshipv1.TxnRequest, _ ...grpc.CallOption) (*walshipv1.TxnResponse, error) {
	return fallBack(x, ctx, in, x.m.Txn, x.kv.Txn)
}

func (x unaryIfUnimplemented) Get(ctx context.Context, in *walshipv1.GetRequest, _ ...grpc.CallOption) (*walshipv1.GetResponse, error) {
	return fallBack(x, ctx, in, x.m.Get, x.kv.Get)
}

func (x unaryIfUnimplemented) Scan(ctx context.Context, in *walshipv1.ScanRequest, opts ...grpc.CallOption) (*walshipv1.ScanResponse, error) {
	return x.kv.Scan(ctx, in, opts...)
}

func (x unaryIfUnimplemented) Watch(ctx context.Context, in *walshipv1.WatchRequest, opts ...grpc.CallOption) (walshipv1.KVService_WatchClient, error) {
	return x.kv.Watch(ctx, in, opts...)
}

func (x unaryIfUnimplemented) Pipeline(ctx context.Context, opts ...grpc.CallOption) (walshipv1.KVService_PipelineClient, error) {
	return x.kv.Pipeline(ctx, opts...)
}

// Primary returns the primary's address, finding it if needed: the node
// that says it is the primary, serving, of the newest epoch; or the
// primary a node names.
func (c *Client) Primary(ctx context.Context) (string, error) {
	c.mu.Lock()
	p := c.primary
	c.mu.Unlock()
	if p != "" {
		return p, nil
	}
	return c.find(ctx)
}

func (c *Client) find(ctx context.Context) (string, error) {
	type found struct {
		addr string
		st   *walshipv1.StatusResponse
		err  error
	}
	c.mu.Lock()
	addrs := append([]string(nil), c.nodes...)
	c.mu.Unlock()
	ch := make(chan found, len(addrs))
	for _, a := range addrs {
		go func() {
			conn, err := c.conn(a)
			if err != nil {
				ch <- found{a, nil, err}
				return
			}
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			st, err := walshipv1.NewAdminServiceClient(conn).Status(sctx, &walshipv1.StatusRequest{})
			ch <- found{a, st, err}
		}()
	}
	var best *walshipv1.StatusResponse
	bestAddr, named := "", ""
	var namedEpoch uint64
	var errs []string
	for range addrs {
		f := <-ch
		if f.err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", f.addr, f.err))
			continue
		}
		if f.st.GetRole() == walshipv1.Role_ROLE_PRIMARY && f.st.GetServing() && (best == nil || f.st.GetEpoch() > best.GetEpoch()) {
			best, bestAddr = f.st, f.addr
		}
		if f.st.GetPrimary() != "" && f.st.GetVoteEpoch() > namedEpoch {
			named, namedEpoch = f.st.GetPrimary(), f.st.GetVoteEpoch()
		}
	}
	addr := bestAddr
	if addr == "" || (namedEpoch > best.GetEpoch() && named != "") {
		addr = named
	}
	if addr == "" {
		return "", fmt.Errorf("walship client: no primary found among %s (%s)", strings.Join(addrs, ", "), strings.Join(errs, "; "))
	}
	c.mu.Lock()
	c.primary = addr
	if !contains(c.nodes, addr) {
		c.nodes = append(c.nodes, addr)
	}
	c.mu.Unlock()
	return addr, nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// forget drops the known primary if it is still addr.
func (c *Client) forget(addr string) {
	c.mu.Lock()
	if c.primary == addr {
		c.primary = ""
	}
	c.mu.Unlock()
}

// NotApplied reports whether err says the cluster did not apply a write:
// a node that is not the primary refused it (FAILED_PRECONDITION), the
// primary refused it before sequencing it (an ErrorInfo of reason
// NOT_SERVING, or one whose metadata says outcome "not_applied": a
// RESOURCE_EXHAUSTED past a bound or a quota), or the call never reached
// a server.
func NotApplied(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	if st.Code() == codes.FailedPrecondition {
		return true
	}
	// The connection could not be made, or the address did not resolve:
	// the call was never sent.
	if st.Code() == codes.Unavailable && (strings.Contains(st.Message(), "Error while dialing") || strings.Contains(st.Message(), "name resolver error")) {
		return true
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && (ei.GetReason() == "NOT_SERVING" || ei.GetMetadata()["outcome"] == "not_applied") {
			return true
		}
	}
	return false
}

// retryDelay is the wait a refusal asks for (a RetryInfo detail), or 0.
func retryDelay(err error) time.Duration {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// retryRead reports whether a read that failed with err may be sent
// again: a read changes nothing, so any failure of the node or of the
// connection — a primary handing over, stepping down or stopping, a
// replica changing role — is retried, as a write the cluster did not
// apply is.
func retryRead(err error) bool {
	if NotApplied(err) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted:
		return true
	}
	return false
}

// onPrimary runs call against the primary, finding it again and retrying
// while the cluster says the call was not applied (any read that may be
// retried, retryRead), within Options.Retry.
func (c *Client) onPrimary(ctx context.Context, write bool, call func(walshipv1.KVServiceClient) error) error {
	deadline := time.Now().Add(c.opts.Retry)
	wait := 20 * time.Millisecond
	for {
		var pause time.Duration
		addr, err := c.Primary(ctx)
		if err == nil {
			var conn *grpc.ClientConn
			if conn, err = c.conn(addr); err == nil {
				err = call(c.kv(addr, conn))
				if err == nil {
					return nil
				}
				if write && !NotApplied(err) {
					c.forget(addr)
					return &UnknownOutcomeError{Err: err}
				}
				if !write && !retryRead(err) {
					return err
				}
				if status.Code(err) == codes.ResourceExhausted {
					// The primary is busy, not gone: it says when to
					// come back (a quota's throttle time).
					pause = retryDelay(err)
				} else {
					c.forget(addr)
				}
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if !backoff.Sleep(ctx, max(pause, wait+time.Duration(rand.Int64N(int64(wait))))) {
			return ctx.Err()
		}
		// At most 100-200 ms between tries: a failover's new primary is
		// found within a tenth of a second or so of opening (a try costs
		// a Status call to each node while the primary is unknown).
		wait = min(2*wait, maxRetryWait)
	}
}

// maxRetryWait bounds the wait between two tries of a call (it is
// spread over up to twice as long).
const maxRetryWait = 100 * time.Millisecond

// Put sets key to value under policy (nil: the server's defaults) and
// returns the commit LSN.
func (c *Client) Put(ctx context.Context, key string, value []byte, policy *walshipv1.CommitPolicy) (uint64, error) {
	var lsn uint64
	err := c.onPrimary(ctx, true, func(kv walshipv1.KVServiceClient) error {
		r, err := kv.Put(ctx, &walshipv1.PutRequest{Key: key, Value: value, Policy: policy})
		if err == nil {
			lsn = r.Lsn
		}
		return err
	})
	return lsn, err
}

// Delete removes key and says whether it existed.
func (c *Client) Delete(ctx context.Context, key string, policy *walshipv1.CommitPolicy) (lsn uint64, existed bool, err error) {
	err = c.onPrimary(ctx, true, func(kv walshipv1.KVServiceClient) error {
		r, err := kv.Delete(ctx, &walshipv1.DeleteRequest{Key: key, Policy: policy})
		if err == nil {
			lsn, existed = r.Lsn, r.Existed
		}
		return err
	})
	return lsn, existed, err
}

// Txn runs a mini-transaction on the primary (a write if a branch writes).
func (c *Client) Txn(ctx context.Context, req *walshipv1.TxnRequest) (*walshipv1.TxnResponse, error) {
	write := false
	for _, op := range append(append([]*walshipv1.TxnOp(nil), req.GetSuccess()...), req.GetFailure()...) {
		if op.GetGet() == nil {
			write = true
		}
	}
	var resp *walshipv1.TxnResponse
	err := c.onPrimary(ctx, write, func(kv walshipv1.KVServiceClient) error {
		r, err := kv.Txn(ctx, req)
		resp = r
		return err
	})
	return resp, err
}

// Get reads key on the primary: linearizable.
func (c *Client) Get(ctx context.Context, key string) (*walshipv1.GetResponse, error) {
	var resp *walshipv1.GetResponse
	err := c.onPrimary(ctx, false, func(kv walshipv1.KVServiceClient) error {
		r, err := kv.Get(ctx, &walshipv1.GetRequest{Key: key, RequirePrimary: true})
		resp = r
		return err
	})
	return resp, err
}

// Scan reads the keys in [req.start, req.end) on the primary:
// linearizable, as Get.
func (c *Client) Scan(ctx context.Context, req *walshipv1.ScanRequest) (*walshipv1.ScanResponse, error) {
	return c.KV().Scan(ctx, req)
}

// GetAt reads key on the node at addr (a replica, typically) once it has
// applied minLSN — the LSN a write of this client returned: read your
// writes on any replica. A node that is changing role (a hand-over) or
// unreachable is asked again within Options.Retry.
func (c *Client) GetAt(ctx context.Context, addr, key string, minLSN uint64) (*walshipv1.GetResponse, error) {
	var out *walshipv1.GetResponse
	err := c.onNodes(ctx, []string{addr}, func(kv walshipv1.KVServiceClient) (err error) {
		out, err = kv.Get(ctx, &walshipv1.GetRequest{Key: key, MinLsn: minLSN})
		return err
	})
	return out, err
}

// GetReplica reads key on a replica once it has applied minLSN (read your
// writes: pass the LSN a write returned), off the primary. It asks the
// data nodes it knows other than the primary in turn, and the primary
// only when none answers. The state read is at least minLSN's; it can
// trail writes of other clients that the primary already acknowledged.
func (c *Client) GetReplica(ctx context.Context, key string, minLSN uint64) (*walshipv1.GetResponse, error) {
	var out *walshipv1.GetResponse
	err := c.onNodes(ctx, c.replicasFirst(), func(kv walshipv1.KVServiceClient) (err error) {
		out, err = kv.Get(ctx, &walshipv1.GetRequest{Key: key, MinLsn: minLSN})
		return err
	})
	return out, err
}

// ScanReplica is Scan on a replica once it has applied minLSN, as
// GetReplica (req.MinLsn is set to minLSN, req.RequirePrimary cleared).
func (c *Client) ScanReplica(ctx context.Context, req *walshipv1.ScanRequest, minLSN uint64) (*walshipv1.ScanResponse, error) {
	req = proto.CloneOf(req)
	req.MinLsn, req.RequirePrimary = minLSN, false
	var out *walshipv1.ScanResponse
	err := c.onNodes(ctx, c.replicasFirst(), func(kv walshipv1.KVServiceClient) (err error) {
		out, err = kv.Scan(ctx, req)
		return err
	})
	return out, err
}

// replicasFirst is the known nodes with the primary, if known, last,
// starting at a random one, so that replica reads spread.
func (c *Client) replicasFirst() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	start := rand.IntN(len(c.nodes))
	for i := range c.nodes {
		if a := c.nodes[(start+i)%len(c.nodes)]; a != c.primary {
			out = append(out, a)
		}
	}
	if c.primary != "" {
		out = append(out, c.primary)
	}
	return out
}

// onNodes runs a read against addrs in turn until one answers, and the
// round again while the failures may pass (retryRead; a node that is no
// data node, a log store, is skipped), within Options.Retry.
func (c *Client) onNodes(ctx context.Context, addrs []string, call func(walshipv1.KVServiceClient) error) error {
	deadline := time.Now().Add(c.opts.Retry)
	wait := 20 * time.Millisecond
	for {
		var err error
		var errs []string
		for _, addr := range addrs {
			var conn *grpc.ClientConn
			if conn, err = c.conn(addr); err == nil {
				if err = call(walshipv1.NewKVServiceClient(conn)); err == nil {
					return nil
				}
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if code := status.Code(err); code == codes.DeadlineExceeded || code == codes.InvalidArgument {
				// min_lsn's wait ran out, or the request is bad: asking
				// again will not help.
				return err
			}
			errs = append(errs, fmt.Sprintf("%s: %v", addr, err))
		}
		if len(addrs) > 1 {
			err = fmt.Errorf("walship client: no node answered (%s): %w", strings.Join(errs[:len(errs)-1], "; "), err)
		}
		if !retryRead(err) && status.Code(err) != codes.Unimplemented && len(addrs) == 1 {
			return err
		}
		if time.Now().After(deadline) {
			return err
		}
		if !backoff.Sleep(ctx, wait+time.Duration(rand.Int64N(int64(wait)))) {
			return ctx.Err()
		}
		wait = min(2*wait, maxRetryWait)
	}
}

// KV is a KVServiceClient that routes every call to the current primary
// as the Client does: writes that fail with an unknown outcome return an
// *UnknownOutcomeError, those the cluster did not apply are retried. Call
// options are ignored: the client decides where and how to send.
func (c *Client) KV() walshipv1.KVServiceClient { return routed{c} }

type routed struct{ c *Client }

func (r routed) Put(ctx context.Context, in *walshipv1.PutRequest, opts ...grpc.CallOption) (*walshipv1.PutResponse, error) {
	var out *walshipv1.PutResponse
	err := r.c.onPrimary(ctx, true, func(kv walshipv1.KVServiceClient) (err error) { out, err = kv.Put(ctx, in); return })
	return out, err
}

func (r routed) Delete(ctx context.Context, in *walshipv1.DeleteRequest, opts ...grpc.CallOption) (*walshipv1.DeleteResponse, error) {
	var out *walshipv1.DeleteResponse
	err := r.c.onPrimary(ctx, true, func(kv walshipv1.KVServiceClient) (err error) { out, err = kv.Delete(ctx, in); return })
	return out, err
}

func (r routed) Get(ctx context.Context, in *walshipv1.GetRequest, opts ...grpc.CallOption) (*walshipv1.GetResponse, error) {
	in = proto.CloneOf(in)
	in.RequirePrimary = true // a replica that the client took for the primary refuses
	var out *walshipv1.GetResponse
	err := r.c.onPrimary(ctx, false, func(kv walshipv1.KVServiceClient) (err error) { out, err = kv.Get(ctx, in); return })
	return out, err
}

func (r routed) Scan(ctx context.Context, in *walshipv1.ScanRequest, opts ...grpc.CallOption) (*walshipv1.ScanResponse, error) {
	in = proto.CloneOf(in)
	in.RequirePrimary = true
	var out *walshipv1.ScanResponse
	err := r.c.onPrimary(ctx, false, func(kv walshipv1.KVServiceClient) (err error) { out, err = kv.Scan(ctx, in); return })
	return out, err
}

func (r routed) Txn(ctx context.Context, in *walshipv1.TxnRequest, opts ...grpc.CallOption) (*walshipv1.TxnResponse, error) {
	write := false
	for _, op := range append(append([]*walshipv1.TxnOp(nil), in.GetSuccess()...), in.GetFailure()...) {
		if op.GetGet() == nil {
			write = true
		}
	}
	var out *walshipv1.TxnResponse
	err := r.c.onPrimary(ctx, write, func(kv walshipv1.KVServiceClient) (err error) { out, err = kv.Txn(ctx, in); return })
	return out, err
}

// Pipeline opens a Pipeline stream on the current primary, as it is: the
// caller's own stream, neither routed again nor retried.
func (r routed) Pipeline(ctx context.Context, opts ...grpc.CallOption) (walshipv1.KVService_PipelineClient, error) {
	addr, err := r.c.Primary(ctx)
	if err != nil {
		return nil, err
	}
	conn, err := r.c.conn(addr)
	if err != nil {
		return nil, err
	}
	return walshipv1.NewKVServiceClient(conn).Pipeline(ctx, opts...)
}
