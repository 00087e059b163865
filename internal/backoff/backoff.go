// Package backoff is the reconnect delay every walship client loop uses:
// exponential from 50ms to 2s, with jitter so that replicas reconnecting
// after a primary restart do not arrive in lockstep.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
)

// Bounds of the delay.
const (
	Min = 50 * time.Millisecond
	Max = 2 * time.Second
)

// Connect is the same delay as a gRPC connection's reconnect backoff, for
// every walship client connection (internal/serve's Dialer, pkg/client):
// gRPC's own starts at 1 s and grows to 2 minutes, while a node that
// changes role — a replica promoted by a failover — restarts its server on
// the same address within tens of milliseconds, and its peers and clients
// must find it again as fast.
var Connect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           grpcbackoff.Config{BaseDelay: Min, Multiplier: 1.6, Jitter: 0.2, MaxDelay: Max},
	MinConnectTimeout: 5 * time.Second,
})

// Backoff is an exponential delay with jitter. The zero value is ready.
type Backoff struct{ next time.Duration }

// Reset makes the next Wait short again (after a healthy connection).
func (b *Backoff) Reset() { b.next = 0 }

// Wait sleeps for the next delay, drawn from [d/2, d], or until ctx is
// done; it reports whether ctx is still live.
func (b *Backoff) Wait(ctx context.Context) bool {
	b.next = min(max(b.next*2, Min), Max)
	d := b.next/2 + rand.N(b.next/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Sleep waits d (not at all if d <= 0) or until ctx ends, and reports
// whether ctx is still live: the one wait of every walship loop that
// paces itself.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
