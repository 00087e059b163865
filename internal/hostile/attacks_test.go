package hostile

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// attack is one way a peer holding a single certificate of the cluster's
// CA tries to exhaust a server: it runs against addr until ctx ends, and
// calls ready once its load is in place. It runs in a process of its own
// (attackerProc), as an attacker does: in the process of the well-behaved
// client it would take that client's share of the Go scheduler.
type attack struct {
	name   string
	target string // "primary", "replica" or "logstore"
	data   bool   // reads the values env.load writes
	run    func(ctx context.Context, e *env, addr string, ready func())
}

// env is what attacks use: the attackers' certificates.
type env struct {
	tb    testing.TB
	certs map[string]tlsid.Files // by class ("": no identity)
}

// attackerClasses are the classes of the attackers' certificates.
var attackerClasses = []string{"", tlsid.ClassClient, tlsid.ClassNode, tlsid.ClassLogStore}

func newEnv(tb testing.TB, k *pki) *env {
	e := &env{tb: tb, certs: map[string]tlsid.Files{}}
	for _, class := range attackerClasses {
		e.certs[class] = k.files(tb, class, "mallory")
	}
	return e
}

// Data the attacks read: scanKeys values of 1 MiB, bigKey one of them.
const (
	scanKeys = 24
	bigKey   = "scan/00"
	mib      = 1 << 20
)

// load writes the values the attacks read, as a client.
func load(ctx context.Context, tb testing.TB, c *cluster) {
	kv := walshipv1.NewKVServiceClient(grpcConn(tb, c.primary.addr, c.pki.files(tb, tlsid.ClassClient, "loader")))
	v := make([]byte, mib)
	for i := range scanKeys {
		if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("scan/%02d", i), Value: v}, grpc.WaitForReady(true)); err != nil {
			tb.Fatalf("load: %v", err)
		}
	}
}

// attacks are the suite's: each attack of issue 33 that holds memory,
// plus many connections, many streams, slow senders and slow readers,
// huge scans and thousands of waiting reads.
var attacks = []attack{
	// Requests sent but for their last byte, on many streams: what a
	// certificate without an identity could once make a server hold
	// before authorization, and what a client still may up to its calls.
	{"slow-sender/no-identity", "primary", false, func(ctx context.Context, e *env, addr string, ready func()) {
		e.stall(ctx, addr, "", 4, 250, "/walship.v1.KVService/Put", partial(2*mib), ready)
	}},
	{"slow-sender/client", "primary", false, func(ctx context.Context, e *env, addr string, ready func()) {
		e.stall(ctx, addr, tlsid.ClassClient, 4, 250, "/walship.v1.KVService/Put", partial(2*mib), ready)
	}},
	// A whole request, then a second one but for its last byte: gRPC
	// holds the first (decoded) while it reads the second.
	{"two-messages/client", "primary", false, func(ctx context.Context, e *env, addr string, ready func()) {
		first := grpcFrame(&walshipv1.PutRequest{Key: "mallory", Value: make([]byte, mib)})
		e.stall(ctx, addr, tlsid.ClassClient, 4, 250, "/walship.v1.KVService/Put", append(first, partial(2*mib)...), ready)
	}},
	{"slow-sender/replica", "replica", false, func(ctx context.Context, e *env, addr string, ready func()) {
		e.stall(ctx, addr, tlsid.ClassClient, 4, 250, "/walship.v1.KVService/Put", partial(2*mib), ready)
	}},
	// A request announcing the log store's own message limit, to a
	// method any certificate may call.
	{"oversize/logstore", "logstore", false, func(ctx context.Context, e *env, addr string, ready func()) {
		e.stall(ctx, addr, tlsid.ClassClient, 4, 250, "/walship.v1.LogStoreService/Status", partial(64*mib), ready)
	}},
	// Streams opened and never sent on.
	{"many-streams/client", "primary", false, func(ctx context.Context, e *env, addr string, ready func()) {
		e.stall(ctx, addr, tlsid.ClassClient, 4, 1000, "/walship.v1.KVService/Put", nil, ready)
	}},
	{"many-conns/client", "primary", false, func(ctx context.Context, e *env, addr string, ready func()) {
		e.manyConns(ctx, addr, 1000, 1000, ready)
	}},
	// Scans of 4 MiB each whose responses are never read.
	{"slow-reader/client", "primary", true, func(ctx context.Context, e *env, addr string, ready func()) {
		e.slowReader(ctx, addr, tlsid.ClassClient, 4, 64, "/walship.v1.KVService/Scan", grpcFrame(&walshipv1.ScanRequest{Start: "scan/"}), ready)
	}},
	// A log store's whole log, read by a peer log store that never
	// takes what it is sent.
	{"slow-reader/logstore", "logstore", true, func(ctx context.Context, e *env, addr string, ready func()) {
		e.slowReader(ctx, addr, tlsid.ClassLogStore, 4, 32, "/walship.v1.LogStoreService/Read", grpcFrame(&walshipv1.ReadRequest{FromLsn: 1, Follow: true}), ready)
	}},
	{"huge-scans/client", "primary", true, func(ctx context.Context, e *env, addr string, ready func()) {
		kv := walshipv1.NewKVServiceClient(grpcConn(e.tb, addr, e.certs[tlsid.ClassClient], grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16*mib))))
		e.loop(ctx, 64, ready, func(ctx context.Context) {
			_, _ = kv.Scan(ctx, &walshipv1.ScanRequest{})
		})
	}},
	// Issue 33, item 3: a Txn reading one 1 MiB value a thousand times.
	{"txn-amplification/client", "primary", true, func(ctx context.Context, e *env, addr string, ready func()) {
		kv := walshipv1.NewKVServiceClient(grpcConn(e.tb, addr, e.certs[tlsid.ClassClient], grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64*mib))))
		req := &walshipv1.TxnRequest{}
		for range 1000 {
			req.Success = append(req.Success, &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Get{Get: &walshipv1.GetOp{Key: bigKey}}})
		}
		e.loop(ctx, 32, ready, func(ctx context.Context) {
			_, _ = kv.Txn(ctx, req)
		})
	}},
	// Issue 33, item 7: reads waiting for an LSN far ahead, from a client
	// (its calls) and from a data node's certificate (the server's
	// waiting reads).
	{"waiting-reads/client", "primary", false, func(ctx context.Context, e *env, addr string, ready func()) {
		e.waitingReads(ctx, addr, tlsid.ClassClient, 3, 1000, ready)
	}},
	{"waiting-reads/node", "primary", false, func(ctx context.Context, e *env, addr string, ready func()) {
		e.waitingReads(ctx, addr, tlsid.ClassNode, 16, 300, ready)
	}},
}

// partial is a gRPC message announcing n bytes and carrying all but the
// last: the server reads it and waits for the rest.
func partial(n int) []byte { return grpcPrefix(n, make([]byte, n-1)) }

// readyAfter calls ready once n calls of done have been made.
func readyAfter(n int, ready func()) (done func()) {
	var left atomic.Int64
	left.Store(int64(n))
	var once sync.Once
	return func() {
		if left.Add(-1) <= 0 {
			once.Do(ready)
		}
	}
}

// stall keeps streams open on conns connections as class, each sent
// frame (nil: nothing) and never ended; a stream the server ends is
// replaced, a connection it closes is dialled again. It is ready after
// 64 streams: more than a peer may have calls in progress (the server
// answers the rest with paced refusals, a hundred a second).
func (e *env) stall(ctx context.Context, addr, class string, conns, streams int, method string, frame []byte, ready func()) {
	opened := readyAfter(min(conns*streams, 64), ready)
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			sem := make(chan struct{}, streams)
			for ctx.Err() == nil {
				h, err := dialH2(ctx, addr, tlsConfig(e.tb, e.certs[class]), 1<<20, true)
				if err != nil {
					opened()
					pause(ctx)
					continue
				}
				// A write the server does not read (a paused refusal)
				// blocks until the connection closes.
				stop := context.AfterFunc(ctx, func() { h.Close() })
				var streamsWG sync.WaitGroup
				for ctx.Err() == nil && h.broken() == nil {
					select {
					case sem <- struct{}{}:
					case <-ctx.Done():
					}
					if ctx.Err() != nil {
						break
					}
					id, err := h.open(method)
					if err != nil {
						<-sem
						break
					}
					opened()
					streamsWG.Go(func() {
						defer func() { <-sem }()
						if frame != nil {
							if err := h.send(ctx, id, frame, false); err != nil {
								h.forget(id)
								return
							}
						}
						_, _, _ = h.wait(ctx, id)
						h.forget(id)
					})
				}
				h.Close()
				stop()
				streamsWG.Wait()
			}
		})
	}
	wg.Wait()
}

// slowReader sends req whole on streams streams of conns connections as
// class, with a 64 KiB window it never returns: the server's answers
// stay unread.
func (e *env) slowReader(ctx context.Context, addr, class string, conns, streams int, method string, req []byte, ready func()) {
	opened := readyAfter(conns*streams, ready)
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			h, err := dialH2(ctx, addr, tlsConfig(e.tb, e.certs[class]), 64<<10, false)
			if err != nil {
				e.tb.Logf("slow reader: %v", err)
				return
			}
			defer h.Close()
			stop := context.AfterFunc(ctx, func() { h.Close() })
			defer stop()
			for range streams {
				id, err := h.open(method)
				if err != nil {
					return
				}
				_ = h.send(ctx, id, req, true)
				opened()
			}
			<-ctx.Done()
		})
	}
	wg.Wait()
}

// manyConns holds up to tlsConns TLS connections as a client, each with
// the HTTP/2 preface sent, and rawConns TCP connections that never begin
// their handshake.
func (e *env) manyConns(ctx context.Context, addr string, tlsConns, rawConns int, ready func()) {
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	cfg := tlsConfig(e.tb, e.certs[tlsid.ClassClient])
	cfg.NextProtos = []string{"h2"}
	d := tls.Dialer{Config: cfg}
	for i := 0; i < tlsConns && ctx.Err() == nil; i++ {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			continue // refused past the identity's connections
		}
		if _, err := c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
			c.Close()
			continue
		}
		held = append(held, c)
	}
	for i := 0; i < rawConns && ctx.Err() == nil; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			continue
		}
		held = append(held, c)
	}
	ready()
	<-ctx.Done()
}

// loop runs call from workers goroutines until ctx ends.
func (e *env) loop(ctx context.Context, workers int, ready func(), call func(context.Context)) {
	started := readyAfter(workers, ready)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			started()
			for ctx.Err() == nil {
				call(ctx)
			}
		})
	}
	wg.Wait()
}

// waitingReads keeps perConn Gets waiting for an LSN far ahead on each of
// conns connections as class; a refused one is asked again.
func (e *env) waitingReads(ctx context.Context, addr, class string, conns, perConn int, ready func()) {
	sent := readyAfter(conns*perConn, ready)
	var wg sync.WaitGroup
	for range conns {
		kv := walshipv1.NewKVServiceClient(grpcConn(e.tb, addr, e.certs[class]))
		for range perConn {
			wg.Go(func() {
				for ctx.Err() == nil {
					sent()
					_, err := kv.Get(ctx, &walshipv1.GetRequest{Key: bigKey, MinLsn: 1 << 60, WaitTimeout: durationpb.New(5 * time.Minute)})
					if err != nil && ctx.Err() == nil {
						pause(ctx)
					}
				}
			})
		}
	}
	wg.Wait()
}

// pause waits a little before a refused attacker tries again, or until
// ctx ends.
func pause(ctx context.Context) {
	t := time.NewTimer(10 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
