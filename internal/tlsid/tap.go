package tlsid

import (
	"context"
	"strings"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// NodeMethod is a method only data nodes may call under the default
// policy (appending to a log store's WAL): a peer the policy lets call it
// is trusted with a node's resources (Trusted).
const NodeMethod = "/walship.v1.LogStoreService/Append"

// Tap authorizes a call from its headers alone — the peer's certificate,
// the method, the metadata — before any of its messages is read: gRPC
// reads a unary request whole (up to the message limit) before the
// interceptors run, and buffers a stream's data up to its flow-control
// window, so a peer the policy refuses could otherwise make a server hold
// memory it was never allowed to use. ctx is a grpc.InTapHandle's (it
// carries the peer and the connection). A refusal is Unary's error. The
// interceptors still run: they alone see a Promote's request.
func (a *Authz) Tap(ctx context.Context, method string) error {
	k, ok := a.cached(ctx, method)
	if ok {
		return nil
	}
	// The rules beyond grpc's: the identity's form now, a Promote's or a
	// ChangeMembers' arguments once the request is read (Unary): here a
	// plain promotion passes, and so does a membership change (the one
	// the peer's class may ask for, or an admin's).
	var req any
	switch method {
	case promoteMethod:
		req = &walshipv1.PromoteRequest{}
	case changeMembersMethod:
		req = unreadChange{}
	}
	if err := a.check(ctx, method, req); err != nil {
		return a.refuse(ctx, method, err)
	}
	if err := a.allows(ctx, method); err != nil {
		return a.refuse(ctx, method, a.deniedErr(ctx, method, err))
	}
	a.remember(k) // a no-op unless cached could have found it
	return nil
}

// Trusted reports whether the policy lets the peer of a tap's ctx call
// NodeMethod: a data node, whose calls (replication streams, appends of
// WAL batches) the per-peer limits of internal/serve must not throttle.
func (a *Authz) Trusted(ctx context.Context) bool {
	if _, ok := a.cached(ctx, NodeMethod); ok {
		return true
	}
	if a.check(ctx, NodeMethod, nil) != nil || a.allows(ctx, NodeMethod) != nil {
		return false
	}
	if a.td != "" {
		a.remember(allowKey{leaf(ctx), NodeMethod})
	}
	return true
}

// TrustedIdentity reports whether id (Principal of a certificate) names a
// data node under the default policy (spiffe://TRUST-DOMAIN/walship/node/
// NAME), for decisions made at the TLS handshake, before any call gives a
// context the policy can be evaluated in. A certificate whose identity is
// malformed is refused at its first call all the same. Under a policy
// file it knows no classes and says false.
func (a *Authz) TrustedIdentity(id string) bool {
	return a.td != "" && strings.HasPrefix(id, "spiffe://"+a.td+"/walship/"+ClassNode+"/")
}

// DefaultPolicy reports whether a is walship's default policy (not a
// policy file).
func (a *Authz) DefaultPolicy() bool { return a.td != "" }

// allows evaluates grpc's policy for a call of method from ctx's peer, as
// its stream interceptor would: the tap's context lacks only the method,
// which grpc's RBAC engine reads from the server transport stream.
func (a *Authz) allows(ctx context.Context, method string) error {
	ctx = grpc.NewContextWithServerTransportStream(ctx, tapStream(method))
	if _, ok := metadata.FromIncomingContext(ctx); !ok {
		ctx = metadata.NewIncomingContext(ctx, metadata.MD{})
	}
	called := false
	err := a.policy.Load().StreamInterceptor(nil, tapServerStream{ctx}, &grpc.StreamServerInfo{FullMethod: method, IsClientStream: true, IsServerStream: true},
		func(any, grpc.ServerStream) error {
			called = true
			return nil
		})
	if called {
		return nil
	}
	return err
}

// tapStream names the method to grpc.Method for the RBAC engine; a tap
// sends nothing.
type tapStream string

func (m tapStream) Method() string                   { return string(m) }
func (tapStream) SetHeader(metadata.MD) error        { return nil }
func (tapStream) SendHeader(metadata.MD) error       { return nil }
func (tapStream) SetTrailer(metadata.MD) error       { return nil }
func (tapServerStream) SetHeader(metadata.MD) error  { return nil }
func (tapServerStream) SendHeader(metadata.MD) error { return nil }
func (tapServerStream) SetTrailer(metadata.MD)       {}
func (s tapServerStream) Context() context.Context   { return s.ctx }
func (tapServerStream) SendMsg(any) error            { return nil }
func (tapServerStream) RecvMsg(any) error            { return nil }

// tapServerStream is the stream grpc's interceptor is shown: its context.
type tapServerStream struct{ ctx context.Context }

// unreadChange stands for a ChangeMembersRequest the tap has not read:
// check lets it through, and Unary checks the request itself.
type unreadChange struct{}
