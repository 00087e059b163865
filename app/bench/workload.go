package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"golang.org/x/sync/errgroup"
)

// workload is one benchmark: its initial data, its transactions and its
// consistency conditions.
type workload interface {
	// load writes the initial data through l.
	load(ctx context.Context, l *loader) error
	// terminal returns terminal i's transaction generator.
	terminal(i int, r *rand.Rand) terminal
	// checker returns a fresh consistency checker.
	checker() checker
	// kinds names the transaction kinds, in the order of stats.kinds.
	kinds() []string
}

// terminal runs one transaction after another.
type terminal interface {
	// next runs one transaction and returns its kind (index into kinds()).
	next(ctx context.Context, s *session) (kind int, err error)
}

// checker receives every key and value of a node's state in key order and
// then reports the consistency conditions that do not hold.
type checker interface {
	add(key string, value []byte)
	// violations lists what does not hold; empty means consistent.
	violations() []string
}

// WorkloadParams sizes the workloads.
type WorkloadParams struct {
	// Warehouses, Items and Customers (per district) size TPC-C.
	Warehouses, Items, Customers int
	// Scale and Accounts (per branch) size TPC-B.
	Scale, Accounts int
	// Records, ValueBytes and Theta shape YCSB.
	Records, ValueBytes int
	Theta               float64
	// PutBytes is the value size of the put workload.
	PutBytes int
	// PutKeys, if positive, makes the put workload overwrite keys drawn at
	// random from this many per run (as redis-benchmark's -r), split
	// evenly between its terminals; 0: every Put writes a new key.
	PutKeys int
	// Seed makes every terminal's choices reproducible.
	Seed int64
	// RunID makes inserted keys (history rows) unique across runs on one
	// cluster.
	RunID string
	// counts is what YCSB terminals report for the checker; nil outside a run.
	counts *runCounts
	// loops is how many terminals a run has (its closed loops).
	loops int
}

func newWorkload(name string, p WorkloadParams) (workload, error) {
	switch name {
	case "tpcc":
		return newTPCC(p), nil
	case "tpcb":
		return newTPCB(p), nil
	case "ycsb-a":
		return newYCSB(p), nil
	case "put":
		return newPut(p), nil
	}
	return nil, fmt.Errorf("unknown workload %q (want tpcc, tpcb, ycsb-a or put)", name)
}

// Workloads lists the workload names.
var Workloads = []string{"tpcc", "tpcb", "ycsb-a", "put"}

// loader writes initial data in Txns of up to maxOps puts, several in
// flight, with async durability: loading is setup, not measured.
type loader struct {
	kv     walshipv1.KVServiceClient
	policy *walshipv1.CommitPolicy
	ops    []*walshipv1.TxnOp
	g      *errgroup.Group
	ctx    context.Context
	keys   int
}

func newLoader(ctx context.Context, kv walshipv1.KVServiceClient) *loader {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	return &loader{kv: kv, g: g, ctx: gctx, policy: &walshipv1.CommitPolicy{
		Durability:  walshipv1.Durability_DURABILITY_ASYNC,
		Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC,
	}}
}

func (l *loader) put(k string, v []byte) error {
	l.ops = append(l.ops, &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: k, Value: v}}})
	l.keys++
	if len(l.ops) == maxOps {
		return l.flush()
	}
	return l.ctx.Err()
}

func (l *loader) flush() error {
	if len(l.ops) == 0 {
		return nil
	}
	req := &walshipv1.TxnRequest{Success: l.ops, Policy: l.policy}
	l.ops = nil
	l.g.Go(func() error {
		if _, err := l.kv.Txn(l.ctx, req); err != nil {
			return fmt.Errorf("load: %w", err)
		}
		return nil
	})
	return l.ctx.Err()
}

// finish flushes, waits, then makes everything durable with one sync Put
// (a sync commit syncs every batch before it), and returns its LSN.
func (l *loader) finish(ctx context.Context) (uint64, error) {
	if err := l.flush(); err != nil {
		return 0, err
	}
	if err := l.g.Wait(); err != nil {
		return 0, err
	}
	r, err := l.kv.Put(ctx, &walshipv1.PutRequest{Key: "bench/loaded", Value: []byte("1"), Policy: &walshipv1.CommitPolicy{
		Durability:  walshipv1.Durability_DURABILITY_SYNC,
		Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC,
	}})
	if err != nil {
		return 0, fmt.Errorf("load: final sync put: %w", err)
	}
	return r.Lsn, nil
}

// keyParts splits a key into its '/'-separated parts.
func keyParts(k string) []string { return strings.Split(k, "/") }
