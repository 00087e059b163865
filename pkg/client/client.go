// Package client is a Go client of a walship cluster. Given any list of
// its nodes it finds the primary — and finds it again after a failover —
// sends writes and linearizable reads there, and reads its own writes on
// replicas with min_lsn.
//
// A write is retried only when the cluster says it did not happen: a node
// that is not the primary refused it, or the primary refused it before
// sequencing it (it was opening its epoch, or had lost its lease). Any
// other failure — a timeout, a broken connection, a primary that failed
// or stepped down with the write in flight — is reported as an
// *UnknownOutcomeError: the write may be committed, and a caller that
// needs to know reads it back.
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
	// DialOptions are used for every node (default: insecure transport).
	DialOptions []grpc.DialOption
	// Retry bounds how long a call keeps looking for the primary (default 10 s).
	Retry time.Duration
}

// Client routes calls to a cluster's nodes. It is safe for concurrent use.
type Client struct {
	opts  Options
	nodes []string

	mu      sync.Mutex
	conns   map[string]*grpc.ClientConn
	primary string // address of the primary, "" until found
}

// New returns a client of the cluster whose nodes (any of them: the
// primary, replicas, even a stale list) are at addrs.
func New(addrs []string, opts Options) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("walship client: no node address")
	}
	if opts.DialOptions == nil {
		opts.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	if opts.Retry <= 0 {
		opts.Retry = 10 * time.Second
	}
	return &Client{opts: opts, nodes: append([]string(nil), addrs...), conns: map[string]*grpc.ClientConn{}}, nil
}

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
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
// a node that is not the primary refused it (FAILED_PRECONDITION), or the
// primary refused it before sequencing it (an ErrorInfo of reason
// NOT_SERVING), or the call never reached a server.
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
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == "NOT_SERVING" {
			return true
		}
	}
	return false
}

// onPrimary runs call against the primary, finding it again and retrying
// while the cluster says the call was not applied, within Options.Retry.
func (c *Client) onPrimary(ctx context.Context, write bool, call func(walshipv1.KVServiceClient) error) error {
	deadline := time.Now().Add(c.opts.Retry)
	wait := 20 * time.Millisecond
	for {
		addr, err := c.Primary(ctx)
		if err == nil {
			var conn *grpc.ClientConn
			if conn, err = c.conn(addr); err == nil {
				err = call(walshipv1.NewKVServiceClient(conn))
				if err == nil {
					return nil
				}
				if !NotApplied(err) {
					if write {
						c.forget(addr)
						return &UnknownOutcomeError{Err: err}
					}
					if status.Code(err) != codes.Unavailable {
						return err
					}
				}
				c.forget(addr)
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		t := time.NewTimer(wait + time.Duration(rand.Int64N(int64(wait))))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		// At most 250-500 ms between tries: a failover's new primary is
		// found within a quarter second or so of opening.
		wait = min(2*wait, 250*time.Millisecond)
	}
}

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

// GetAt reads key on the node at addr (a replica, typically) once it has
// applied minLSN — the LSN a write of this client returned: read your
// writes on any replica.
func (c *Client) GetAt(ctx context.Context, addr, key string, minLSN uint64) (*walshipv1.GetResponse, error) {
	conn, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	return walshipv1.NewKVServiceClient(conn).Get(ctx, &walshipv1.GetRequest{Key: key, MinLsn: minLSN}, grpc.WaitForReady(true))
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
