package grpcfuzz

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/services/primary"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// checkTimeout bounds each step of a cluster check: generous, since a
// promotion the batch legitimately made may still be opening its epoch.
const checkTimeout = 10 * time.Second

// dataNodes are the targets that are data nodes.
func dataNodes() []target { return []target{targetPrimary, targetReplica} }

// writer is the data node that takes writes now, waiting (bounded) for
// one: after a switchover the new primary opens its epoch first.
func (e *env) writer(ctx context.Context) (target, error) {
	var last error
	for {
		for _, n := range dataNodes() {
			st, err := e.status(ctx, n)
			if err != nil {
				last = err
				continue
			}
			if st.GetTakingWrites() {
				return n, nil
			}
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("no data node takes writes (last error: %v)", last)
		}
		pause(ctx)
	}
}

// other is the data node that is not n.
func other(n target) target {
	if n == targetPrimary {
		return targetReplica
	}
	return targetPrimary
}

// healthy checks that the cluster still works and agrees with itself:
// every server reports SERVING; a data node takes writes; a well-behaved
// Put there is read back, at its LSN, on the other data node; and both
// reach the same LSN with the same state digest.
func (e *env) healthy(tag string) error {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	for n := range numTargets {
		// A role change restarts a data node's server: refused, then
		// NOT_SERVING for a moment.
		var resp *grpc_health_v1.HealthCheckResponse
		var err error
		for {
			resp, err = grpc_health_v1.NewHealthClient(e.conns[classNoID][n]).Check(ctx, &grpc_health_v1.HealthCheckRequest{})
			if (err == nil && resp.GetStatus() == grpc_health_v1.HealthCheckResponse_SERVING) || ctx.Err() != nil {
				break
			}
			pause(ctx)
		}
		if err != nil || resp.GetStatus() != grpc_health_v1.HealthCheckResponse_SERVING {
			return fmt.Errorf("%s: health %v, %v", e.name(n), resp.GetStatus(), err)
		}
	}
	// A promotion the batch made may still be settling (the deposed
	// primary restarting as a replica): retry until the deadline, and
	// report the last failure only if it never works.
	for {
		err := e.consistent(ctx, tag)
		if err == nil || ctx.Err() != nil {
			return err
		}
		pause(ctx)
	}
}

// consistent writes through the data node that takes writes, reads it
// back on the other, and compares their LSN and digest.
func (e *env) consistent(ctx context.Context, tag string) error {
	w, err := e.writer(ctx)
	if err != nil {
		return err
	}
	value := []byte("check " + tag)
	put, err := walshipv1.NewKVServiceClient(e.conns[classClient][w]).Put(ctx, &walshipv1.PutRequest{Key: "fuzz/check", Value: value})
	if err != nil {
		return fmt.Errorf("a well-behaved Put on %s: %w", e.name(w), err)
	}
	r := other(w)
	get, err := walshipv1.NewKVServiceClient(e.conns[classClient][r]).Get(ctx, &walshipv1.GetRequest{Key: "fuzz/check", MinLsn: put.GetLsn(),
		WaitTimeout: durationpb.New(checkTimeout)})
	if err != nil || !bytes.Equal(get.GetValue(), value) {
		return fmt.Errorf("%s: Get of the Put at LSN %d: %q, %v", e.name(r), put.GetLsn(), get.GetValue(), err)
	}
	for {
		ws, err1 := e.status(ctx, w)
		rs, err2 := e.status(ctx, r)
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("status: %w", err)
		}
		if ws.GetVisibleLsn() == rs.GetVisibleLsn() && ws.GetStateDigest() == rs.GetStateDigest() {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s at LSN %d digest %s, %s at LSN %d digest %s: they do not agree", e.name(w), ws.GetVisibleLsn(), ws.GetStateDigest(),
				e.name(r), rs.GetVisibleLsn(), rs.GetStateDigest())
		}
		pause(ctx) // replication has no event the harness can wait on from outside
	}
}

// handover checks that the cluster can still change its primary: a
// well-behaved Switchover to the other data node succeeds and the cluster
// is healthy after it. A request that wedged the epochs (one at the top of
// their range) shows here.
func (e *env) handover(tag string) error {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	w, err := e.writer(ctx)
	if err != nil {
		return err
	}
	to := e.nodes[other(w)].Name
	if _, err := walshipv1.NewAdminServiceClient(e.conns[classAdmin][w]).Switchover(ctx, &walshipv1.SwitchoverRequest{Target: to,
		Timeout: durationpb.New(10 * time.Second)}); err != nil {
		return fmt.Errorf("a well-behaved Switchover from %s to %s: %w", e.name(w), to, err)
	}
	return e.healthy(tag + " after a switchover")
}

// repair does what an operator would after a legitimate disruption (a
// promotion, a fence, a policy no commit can meet): puts the default
// policy back and, if no data node takes writes, promotes one.
func (e *env) repair() {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	w, err := e.writer(wctx)
	wcancel()
	if err != nil {
		for _, n := range dataNodes() {
			if _, err = walshipv1.NewAdminServiceClient(e.conns[classAdmin][n]).Promote(ctx, &walshipv1.PromoteRequest{}); err == nil {
				break
			}
		}
		if w, err = e.writer(ctx); err != nil {
			return
		}
	}
	_, _ = walshipv1.NewAdminServiceClient(e.conns[classAdmin][w]).SetPolicy(ctx, &walshipv1.SetPolicyRequest{Policy: proto.Clone(e.policy).(*walshipv1.CommitPolicy)})
}

// fixture puts the keys the seeds use and deletes every other key, so
// that each batch starts from the same state (and the heap holds the same
// data).
func (e *env) fixture(bigValue int) error {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	w, err := e.writer(ctx)
	if err != nil {
		return err
	}
	kv := walshipv1.NewKVServiceClient(e.conns[classAdmin][w])
	for {
		scan, err := kv.Scan(ctx, &walshipv1.ScanRequest{Limit: 1000})
		if err != nil {
			return fmt.Errorf("scan: %w", err)
		}
		var ops []*walshipv1.TxnOp
		for _, p := range scan.GetKvs() {
			if p.GetKey() != smallKey && p.GetKey() != bigKey {
				ops = append(ops, &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Delete{Delete: &walshipv1.DeleteOp{Key: p.GetKey()}}})
			}
		}
		if len(ops) == 0 {
			break
		}
		if _, err := kv.Txn(ctx, &walshipv1.TxnRequest{Success: ops}); err != nil {
			return fmt.Errorf("delete %d keys: %w", len(ops), err)
		}
	}
	for k, v := range map[string][]byte{smallKey: []byte("v"), bigKey: bytes.Repeat([]byte{'b'}, bigValue)} {
		if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: k, Value: v}); err != nil {
			return fmt.Errorf("put %s: %w", k, err)
		}
	}
	return nil
}

// heapInUse is the process's HeapInuse after a full collection: every
// server's live heap (and the harness's, which holds nothing between
// batches but its connections).
func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC() // a second cycle frees what the first one's finalizers released
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// disruptive reports whether a call may have legitimately changed who
// the primary is, the epochs, the default policy or a log: an OK (or cut
// short) call of a method that changes them, by a class allowed to.
func (e *env) disruptive(in input, out outcome) bool {
	switch in.Method {
	case "/walship.v1.AdminService/Promote", "/walship.v1.AdminService/Switchover", "/walship.v1.AdminService/SetPolicy",
		"/walship.v1.EpochService/Fence", "/walship.v1.LogStoreService/Append", "/walship.v1.LogStoreService/PutSnapshot",
		"/walship.v1.ReplicationService/Stream":
	default:
		return false
	}
	if !e.mayCall(in.class(), in.Method) {
		return false
	}
	switch out.code {
	case codes.PermissionDenied, codes.Unimplemented, codes.InvalidArgument, codes.ResourceExhausted:
		return false
	}
	return true
}

// settle waits (bounded) until every data node that takes writes has
// heard from its log stores after end, the end of a batch that may have
// changed their state: a log store moved to another epoch, or fenced,
// tells the primary only in its answer to the next heartbeat, and the
// checks must see what that answer does.
func (e *env) settle(end time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for _, n := range dataNodes() {
		for ctx.Err() == nil {
			st, err := e.status(ctx, n)
			if err != nil || !st.GetTakingWrites() {
				break
			}
			// The lease runs from the last answer of a log store majority.
			if heard := time.Now().Add(st.GetLeaseRemaining().AsDuration() - primary.DefaultLeaseTimeout); heard.After(end) {
				break
			}
			pause(ctx)
		}
	}
}

// orphans is how many orphan files the log store reports (-1 if it does
// not answer).
func (e *env) orphans() int {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	st, err := e.status(ctx, targetLogStore)
	if err != nil {
		return -1
	}
	return len(st.GetOrphans())
}

// pause waits a poll interval, or until ctx ends: the checks poll
// conditions that have no event to wait on from outside the servers,
// each under a deadline.
func pause(ctx context.Context) {
	t := time.NewTimer(20 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
