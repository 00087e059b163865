package check

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	walshipclient "github.com/walship/walship/pkg/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Workload is a linearizability workload: Concurrency clients, each
// sending one operation at a time — Get (as a Get or a read-only Txn), Put,
// Delete and compare-and-swap Txns with unique values — to a few keys
// under Prefix. Every KeyWindow it moves to fresh keys, which keeps each
// key's history short enough for the checker whatever the run's length.
type Workload struct {
	// Primary is where every operation goes.
	Primary walshipv1.KVServiceClient
	// Replica, if set, also gets a read after each acknowledged write of a
	// client, with min_lsn set to the write's LSN; its answers are checked
	// for read-your-writes and for never going backwards (Session).
	Replica walshipv1.KVServiceClient
	// Prefix of every key the workload touches (nothing else is).
	Prefix string
	// Keys at a time (default 5), Concurrency clients (default 6).
	Keys, Concurrency int
	// KeyWindow is how long a set of keys is used (default 2 s).
	KeyWindow time.Duration
	// Rate bounds the operations per second of all clients together
	// (0: as fast as answers come).
	Rate float64
	// OpTimeout bounds each operation (default 5 s); a write that times
	// out has an unknown outcome.
	OpTimeout time.Duration
	// Policy picks each write's policy (nil: the server's defaults).
	Policy func(r *rand.Rand) *walshipv1.CommitPolicy
	// Defaults is the server's default policy (AdminService.Status), which
	// fills what Policy leaves unset.
	Defaults *walshipv1.CommitPolicy
	// Crashes says the run kills or restarts nodes: an acknowledged write
	// whose policy lets a crash lose it (durability async: acknowledged
	// before the primary's own fsync) is recorded as of unknown outcome.
	Crashes bool
	// Seed makes the operation mix repeatable (0: random).
	Seed uint64
}

// losable reports whether a crash of the primary's machine may lose a
// write acknowledged under p: one acknowledged before the primary's own
// fsync. Without Defaults, an unset durability counts as async.
func (w *Workload) losable(p *walshipv1.CommitPolicy) bool {
	d, r, l := p.GetDurability(), p.GetReplication(), p.GetLogstore()
	if d == walshipv1.Durability_DURABILITY_UNSPECIFIED {
		d = w.Defaults.GetDurability()
	}
	if r == walshipv1.ReplicationMode_REPLICATION_MODE_UNSPECIFIED {
		r = w.Defaults.GetReplication()
	}
	if l == walshipv1.LogStoreAck_LOG_STORE_ACK_UNSPECIFIED {
		l = w.Defaults.GetLogstore()
	}
	// Sync replication or a log-store wait implies the local fsync.
	return d != walshipv1.Durability_DURABILITY_SYNC &&
		r != walshipv1.ReplicationMode_REPLICATION_MODE_SYNC &&
		l != walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC
}

// SessionReport is what the replica reads found.
type SessionReport struct {
	Reads      int      // replica reads answered
	Violations []string // read-your-writes or monotonic-read violations
}

// Run drives the workload until ctx ends or d has passed, recording every
// operation into h (a new one if nil), and returns the history and the
// replica session report.
func (w Workload) Run(ctx context.Context, d time.Duration, h *History) (*History, SessionReport, error) {
	if w.Primary == nil {
		return nil, SessionReport{}, errors.New("check: Workload.Primary is required")
	}
	if w.Keys <= 0 {
		w.Keys = 5
	}
	if w.Concurrency <= 0 {
		w.Concurrency = 6
	}
	if w.KeyWindow <= 0 {
		w.KeyWindow = 2 * time.Second
	}
	if w.OpTimeout <= 0 {
		w.OpTimeout = 5 * time.Second
	}
	if h == nil {
		h = NewHistory()
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	seed := w.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		session SessionReport
	)
	start := time.Now()
	for c := range w.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := &client{w: &w, h: h, id: c, rnd: rand.New(rand.NewPCG(seed, uint64(c))), known: map[string]register{}, start: start}
			cl.run(ctx)
			mu.Lock()
			session.Reads += cl.session.Reads
			session.Violations = append(session.Violations, cl.session.Violations...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return h, session, nil
}

// client is one of the workload's clients.
type client struct {
	w     *Workload
	h     *History
	id    int
	rnd   *rand.Rand
	start time.Time
	seq   int
	// known is the last value this client saw or wrote per key: the
	// expected value of its compare-and-swaps, so that some hold.
	known map[string]register
	// replica: the highest applied LSN a replica read answered at.
	replicaApplied uint64
	session        SessionReport
}

func (c *client) run(ctx context.Context) {
	var interval time.Duration
	if c.w.Rate > 0 {
		interval = time.Duration(float64(c.w.Concurrency) / c.w.Rate * float64(time.Second))
	}
	// The deadline, not only ctx.Err(): a context's timer may fire late on
	// a busy machine, and every call made meanwhile would fail at once,
	// each a write of unknown outcome.
	end, ok := ctx.Deadline()
	next := time.Now()
	for ctx.Err() == nil && (!ok || time.Now().Before(end)) {
		if interval > 0 {
			next = next.Add(interval)
			if d := time.Until(next); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return
				}
			} else {
				next = time.Now() // fell behind: do not burst
			}
		}
		c.one(ctx)
	}
}

// key picks one of the current window's keys.
func (c *client) key() string {
	window := int(time.Since(c.start) / c.w.KeyWindow)
	return fmt.Sprintf("%sw%d/k%d", c.w.Prefix, window, c.rnd.IntN(c.w.Keys))
}

func (c *client) one(ctx context.Context) {
	key := c.key()
	c.seq++
	value := fmt.Sprintf("c%d-%d", c.id, c.seq)
	var pol *walshipv1.CommitPolicy
	if c.w.Policy != nil {
		pol = c.w.Policy(c.rnd)
	}
	opCtx, cancel := context.WithTimeout(ctx, c.w.OpTimeout)
	defer cancel()
	op := Op{Client: c.id}
	var err error
	var lsn uint64
	switch n := c.rnd.IntN(10); {
	case n < 2: // Get
		op.Input = Input{Kind: KindGet, Key: key}
		op.Call = c.h.Now()
		var r *walshipv1.GetResponse
		if r, err = c.w.Primary.Get(opCtx, &walshipv1.GetRequest{Key: key}, ready); err == nil {
			op.Output = Output{Found: r.Found, Value: string(r.Value), LSN: r.AppliedLsn}
		}
	case n < 4: // a read-only Txn
		op.Input = Input{Kind: KindGet, Key: key}
		op.Call = c.h.Now()
		var r *walshipv1.TxnResponse
		if r, err = c.w.Primary.Txn(opCtx, &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{{Op: &walshipv1.TxnOp_Get{Get: &walshipv1.GetOp{Key: key}}}}}, ready); err == nil {
			g := r.Results[0].GetGet()
			op.Output = Output{Found: g.GetFound(), Value: string(g.GetValue()), LSN: r.Lsn}
		}
	case n < 7: // Put
		op.Input = Input{Kind: KindPut, Key: key, Value: value}
		op.Call = c.h.Now()
		var r *walshipv1.PutResponse
		if r, err = c.w.Primary.Put(opCtx, &walshipv1.PutRequest{Key: key, Value: []byte(value), Policy: pol}, ready); err == nil {
			lsn = r.Lsn
		}
	case n < 8: // Delete
		op.Input = Input{Kind: KindDelete, Key: key}
		op.Call = c.h.Now()
		var r *walshipv1.DeleteResponse
		if r, err = c.w.Primary.Delete(opCtx, &walshipv1.DeleteRequest{Key: key, Policy: pol}, ready); err == nil {
			lsn, op.Output.Existed = r.Lsn, r.Existed
		}
	default: // compare-and-swap on what this client last saw
		known := c.known[key]
		op.Input = Input{Kind: KindCAS, Key: key, Value: value, Expect: known.value, ExpectAbsent: !known.present}
		cmp := &walshipv1.Compare{Key: key, Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL}
		if known.present {
			cmp.Target, cmp.Operand = walshipv1.CompareTarget_COMPARE_TARGET_VALUE, &walshipv1.Compare_Value{Value: []byte(known.value)}
		} else {
			cmp.Target, cmp.Operand = walshipv1.CompareTarget_COMPARE_TARGET_EXISTS, &walshipv1.Compare_Exists{Exists: false}
		}
		op.Call = c.h.Now()
		var r *walshipv1.TxnResponse
		if r, err = c.w.Primary.Txn(opCtx, &walshipv1.TxnRequest{Compares: []*walshipv1.Compare{cmp}, Policy: pol,
			Success: []*walshipv1.TxnOp{{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: key, Value: []byte(value)}}}}}, ready); err == nil {
			lsn, op.Output.Succeeded = r.Lsn, r.Succeeded
		}
	}
	op.Return = c.h.Now()
	if err != nil {
		if op.Input.Kind == KindGet || NotApplied(err) {
			return // says nothing about the state
		}
		op.Output = Output{Unknown: true, Err: err.Error()}
		c.h.Add(op)
		delete(c.known, key)
		return
	}
	if op.Input.Kind == KindGet {
		c.known[key] = register{present: op.Output.Found, value: op.Output.Value}
		c.h.Add(op)
		return
	}
	op.Output.LSN = lsn
	switch {
	case op.Input.Kind == KindDelete:
		c.known[key] = register{}
	case op.Input.Kind == KindPut || op.Output.Succeeded:
		c.known[key] = register{present: true, value: value}
	}
	if c.w.Crashes && c.w.losable(pol) {
		// Acknowledged, but a crash may take it back: as far as the
		// checker knows, it may never have happened.
		op.Output.Unknown, op.Output.Err = true, "acknowledged under a policy a crash may undo"
	}
	c.h.Add(op)
	if c.w.Replica != nil && (op.Input.Kind != KindCAS || op.Output.Succeeded) {
		c.readReplica(ctx, key, lsn, op.Input.Kind == KindDelete)
	}
}

// readReplica reads key on the replica at min_lsn lsn, just after this
// client's write at lsn: the read must be at lsn or later (read your
// writes), never below an earlier read of this client's (reads do not go
// backwards), and show the write or a newer version.
func (c *client) readReplica(ctx context.Context, key string, lsn uint64, deleted bool) {
	rctx, cancel := context.WithTimeout(ctx, c.w.OpTimeout)
	defer cancel()
	r, err := c.w.Replica.Get(rctx, &walshipv1.GetRequest{Key: key, MinLsn: lsn})
	if err != nil {
		return // a replica that is away or behind says nothing
	}
	c.session.Reads++
	var bad []string
	if r.AppliedLsn < lsn {
		bad = append(bad, fmt.Sprintf("read at applied LSN %d, below min_lsn %d", r.AppliedLsn, lsn))
	}
	if r.AppliedLsn < c.replicaApplied {
		bad = append(bad, fmt.Sprintf("read at applied LSN %d after a read at %d (went backwards)", r.AppliedLsn, c.replicaApplied))
	}
	if r.Found && r.VersionLsn < lsn {
		bad = append(bad, fmt.Sprintf("found version %d, older than the client's own write at %d", r.VersionLsn, lsn))
	}
	if !deleted && !r.Found && r.AppliedLsn == lsn {
		bad = append(bad, fmt.Sprintf("not found at LSN %d, the LSN of the client's own put", lsn))
	}
	c.replicaApplied = max(c.replicaApplied, r.AppliedLsn)
	if len(bad) > 0 {
		c.session.Violations = append(c.session.Violations, fmt.Sprintf("client %d, key %s: %s", c.id, key, strings.Join(bad, "; ")))
	}
}

// ready makes a call wait for a connection instead of failing at once
// while the node is down: a write that fails before it is sent would
// otherwise count as one of unknown outcome, and a client spinning on a
// dead node would fill the history with them.
var ready = grpc.WaitForReady(true)

// ReadBack reads every key of h once more from the primary (waiting for
// it to be reachable) and records the reads in h: run after the faults,
// it checks that every acknowledged write the history promises is there.
func (w Workload) ReadBack(ctx context.Context, h *History) error {
	keys := map[string]bool{}
	for _, op := range h.Ops() {
		keys[op.Input.Key] = true
	}
	for k := range keys {
		op, r, err := w.readBack(ctx, h, k)
		if err != nil {
			return fmt.Errorf("read back %s: %w", k, err)
		}
		op.Return, op.Output = h.Now(), Output{Found: r.Found, Value: string(r.Value), LSN: r.AppliedLsn}
		h.Add(op)
	}
	return nil
}

// readBack reads k from the primary, asking again while it refuses the
// read as not serving (a primary restarted by the last fault may still be
// opening its epoch), until ctx ends. A refused read did nothing and is
// not recorded; op is the call that answered.
func (w Workload) readBack(ctx context.Context, h *History, k string) (Op, *walshipv1.GetResponse, error) {
	for {
		op := Op{Client: w.Concurrency, Input: Input{Kind: KindGet, Key: k}, Call: h.Now()}
		r, err := w.Primary.Get(ctx, &walshipv1.GetRequest{Key: k}, ready)
		if err == nil || !walshipclient.NotApplied(err) {
			return op, r, err
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return op, nil, fmt.Errorf("%w (the primary still refused it when the deadline came: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// NotApplied reports whether a write that failed with err certainly did
// not happen: the server refused it before sequencing it (a bad argument,
// a node that is not the primary, a refused credential, or what
// client.NotApplied reads as a refusal: a primary that is opening its
// epoch, handing over or without its lease says NOT_SERVING). Anything
// else — UNAVAILABLE without that, DEADLINE_EXCEEDED, a broken
// connection — may have been applied.
func NotApplied(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.ResourceExhausted,
		codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented, codes.OutOfRange:
		return true
	}
	return walshipclient.NotApplied(err)
}

// RandomPolicy gives a write a random policy: either durability, every
// replication mode, k of 1 or 2 at each stage, one write in four waiting
// for the log stores too. Sync waits time out after 3 s.
func RandomPolicy(r *rand.Rand) *walshipv1.CommitPolicy {
	p := &walshipv1.CommitPolicy{SyncTimeout: durationpb.New(3 * time.Second)}
	p.Durability = []walshipv1.Durability{walshipv1.Durability_DURABILITY_SYNC, walshipv1.Durability_DURABILITY_ASYNC}[r.IntN(2)]
	switch r.IntN(3) {
	case 0:
		p.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC
	case 1:
		p.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED
	default:
		p.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC
		p.SyncReplicas = uint32(1 + r.IntN(2))
		p.SyncLevel = walshipv1.SyncLevel(1 + r.IntN(3))
	}
	if r.IntN(4) == 0 {
		p.Logstore = walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC
	}
	return p
}

// DeleteKeys deletes every key h touched, so that a check leaves nothing
// behind, and returns how many it deleted.
func (w Workload) DeleteKeys(ctx context.Context, h *History) (int, error) {
	keys := map[string]bool{}
	for _, op := range h.Ops() {
		keys[op.Input.Key] = true
	}
	n := 0
	for k := range keys {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := w.Primary.Delete(dctx, &walshipv1.DeleteRequest{Key: k})
		cancel()
		if err != nil {
			return n, fmt.Errorf("delete %s: %w", k, err)
		}
		n++
	}
	return n, nil
}
