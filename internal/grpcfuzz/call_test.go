package grpcfuzz

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// input is one fuzz input: what to send to which server, as whom.
type input struct {
	Node   uint8  // the target server (mod numTargets)
	Method string // full method name; one no server knows is sent too
	Class  uint8  // the caller's certificate class (mod numClasses)
	// Seed 0 sends Msg as it is, once, and half-closes; any other seed
	// drives the mutations of Msg and, on a stream, the script (how many
	// messages, a half-close or not, a cancel).
	Seed uint64
	// Msg is the base request in wire format. String fields may hold
	// ${cluster_id}, ${primary_addr}, ${replica_addr} or
	// ${logstore_addr}, replaced by the live values.
	Msg []byte
}

func (in input) target() target { return target(in.Node % uint8(numTargets)) }
func (in input) class() class   { return class(in.Class % uint8(numClasses)) }

// corpus is in as a file of FuzzGRPC's corpus: saved as
// testdata/fuzz/FuzzGRPC/NAME, `go test -run FuzzGRPC/NAME` replays it.
func (in input) corpus() string {
	return fmt.Sprintf("go test fuzz v1\nuint8(%d)\nstring(%s)\nuint8(%d)\nuint64(%d)\n[]byte(%s)\n",
		in.Node, strconv.Quote(in.Method), in.Class, in.Seed, strconv.Quote(string(in.Msg)))
}

// outcome is what one input did.
type outcome struct {
	sent     [][]byte // the messages sent, in wire format
	code     codes.Code
	message  string
	ended    bool // the harness cancelled the call itself (its script, or an idle stream)
	received int  // response messages
	recvd    int  // response bytes
	alloc    uint64
	problems []string // what is wrong with it (empty: nothing)
}

// rawCodec sends and receives messages as the bytes they are, so that the
// harness can send what no generated client would (invalid UTF-8, unknown
// fields, noise) and judge what comes back itself. Named "proto": the
// servers decode with their own codec.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// Bounds of one call: a unary call that waits (a read for a future LSN,
// a promotion waiting out a lease) is cut at callTimeout; a stream that
// sends nothing for streamIdle is cancelled (a follow Read never ends).
// Both are the harness's patience, not assertions: a call it cut is
// judged only for what it had received.
const (
	callTimeout = 3 * time.Second
	streamIdle  = 400 * time.Millisecond
)

// dataLossMethods may answer DATA_LOSS: their requests carry data with a
// checksum (a WAL batch's CRC, a snapshot's digest) that a mutation breaks,
// so the data really is corrupt. Anywhere else DATA_LOSS would mean the
// server's own data is, and the harness never damages it.
func dataLossMethods() map[string]bool {
	return map[string]bool{
		"/walship.v1.LogStoreService/Append":      true,
		"/walship.v1.LogStoreService/PutSnapshot": true,
	}
}

// allowedCodes are the codes a walship server may answer anything with
// (UNIMPLEMENTED and DATA_LOSS are judged apart). Never UNKNOWN or
// INTERNAL: each is a bug (a panic recovered by someone, an error no one
// mapped, a request gRPC could not decode reported as the server's fault).
func allowedCodes() map[codes.Code]bool {
	return map[codes.Code]bool{
		codes.OK: true, codes.InvalidArgument: true, codes.FailedPrecondition: true, codes.OutOfRange: true,
		codes.PermissionDenied: true, codes.ResourceExhausted: true, codes.Unavailable: true, codes.NotFound: true,
		codes.DeadlineExceeded: true, codes.AlreadyExists: true, codes.Aborted: true, codes.Canceled: true,
	}
}

// plan turns in into the messages to send and the stream's script.
type script struct {
	frames    [][]byte
	halfClose bool // CloseSend after the frames
	cancelAt  int  // cancel after sending this many frames (-1: never)
	maxRecv   int  // cancel after receiving this many responses
}

// plan builds in's script: the frames (mutated as in.Seed says) and what
// to do after sending them.
func (e *env) plan(in input, md protoreflect.MethodDescriptor, seeds map[string][][]byte) script {
	sc := script{halfClose: true, cancelAt: -1, maxRecv: 64}
	base, decoded := e.expand(in.Msg, md)
	if in.Seed == 0 {
		sc.frames = [][]byte{base}
		return sc
	}
	r := rand.New(rand.NewPCG(in.Seed, in.Seed^0x9e3779b97f4a7c15))
	mu := NewMutator(r, e.maxBytes)
	mu.Strings, mu.Numbers = e.liveStrings(), e.liveNumbers()
	n := 1
	if md != nil && md.IsStreamingClient() {
		n = r.IntN(6) // 0: open the stream and half-close at once
	}
	for i := range n {
		src, ok := base, decoded
		if i > 0 || r.IntN(4) == 0 {
			// Another seed of the same method: a stream of several kinds
			// of message (a heartbeat, then a batch, then a truncate).
			if alt := seeds[in.Method]; len(alt) > 0 {
				src, ok = e.expand(alt[r.IntN(len(alt))], md)
			}
		}
		sc.frames = append(sc.frames, e.mutate(mu, r, src, ok, md))
	}
	if md != nil && (md.IsStreamingClient() || md.IsStreamingServer()) {
		switch r.IntN(8) {
		case 0:
			sc.halfClose = false // leave the stream open; the idle cancel ends it
		case 1:
			sc.cancelAt = r.IntN(len(sc.frames) + 1)
		case 2:
			sc.maxRecv = r.IntN(3)
		}
	}
	return sc
}

// mutate returns one frame made from b: b itself, b with schema-aware
// mutations, with wire mutations on top, or noise.
func (e *env) mutate(mu *Mutator, r *rand.Rand, b []byte, decoded bool, md protoreflect.MethodDescriptor) []byte {
	if md == nil {
		if r.IntN(2) == 0 {
			return b
		}
		return mu.Noise()
	}
	in := md.Input()
	switch k := r.IntN(20); {
	case k < 3:
		return b
	case k < 4:
		return mu.Noise()
	case k < 7:
		// Invalid UTF-8 gets a share of its own: the server's own
		// UTF-8 check sits between the codec and the handlers.
		if out, ok := mu.invalidUTF8(b, in); ok {
			return out
		}
		return mu.Wire(b, in)
	case k < 10 || !decoded:
		return mu.Wire(b, in)
	default:
		m := newMessage(in)
		if err := proto.Unmarshal(b, m.Interface()); err != nil {
			return mu.Wire(b, in)
		}
		mu.Message(m, 3)
		out, err := proto.MarshalOptions{Deterministic: true}.Marshal(m.Interface())
		if err != nil {
			return mu.Wire(b, in)
		}
		if r.IntN(3) == 0 {
			out = mu.Wire(out, in)
		}
		return out
	}
}

// newMessage is an empty message of type md (nil-safe for types the
// process does not know: then a dynamic one).
func newMessage(md protoreflect.MessageDescriptor) protoreflect.Message {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
	if err != nil {
		panic(fmt.Sprintf("grpcfuzz: %s is not linked in: %v", md.FullName(), err))
	}
	return mt.New()
}

// expand replaces the templates in the string fields of b (as md's
// request type) with live values. It reports whether b decoded; b that
// does not is returned as it is.
func (e *env) expand(b []byte, md protoreflect.MethodDescriptor) ([]byte, bool) {
	if md == nil {
		return b, false
	}
	m := newMessage(md.Input())
	if err := proto.Unmarshal(b, m.Interface()); err != nil {
		return b, false
	}
	if !bytes.Contains(b, []byte("${")) {
		return b, true
	}
	repl := strings.NewReplacer("${cluster_id}", e.clusterID, "${primary_addr}", e.nodes[targetPrimary].Addr,
		"${replica_addr}", e.nodes[targetReplica].Addr, "${logstore_addr}", e.nodes[targetLogStore].Addr)
	walkStrings(m, func(s string) string { return repl.Replace(s) })
	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(m.Interface())
	if err != nil {
		return b, false
	}
	return out, true
}

// walkStrings replaces every string field of m and of the messages below
// it with f of it.
func walkStrings(m protoreflect.Message, f func(string) string) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				switch {
				case fd.Kind() == protoreflect.StringKind:
					l.Set(i, protoreflect.ValueOfString(f(l.Get(i).String())))
				case fd.Message() != nil:
					walkStrings(l.Get(i).Message(), f)
				}
			}
		case fd.Kind() == protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(f(v.String())))
		case fd.Message() != nil:
			walkStrings(v.Message(), f)
		}
		return true
	})
}

// liveStrings are values the mutator tries in string fields.
func (e *env) liveStrings() []string {
	ss := []string{e.clusterID, "primary", "replica-0", "fuzz/a", "fuzz/big", "fuzz/", "fuzz0"}
	for _, n := range e.nodes {
		ss = append(ss, n.Addr)
	}
	return ss
}

// liveNumbers are values the mutator tries in integer fields: the epoch
// and LSNs the cluster is at.
func (e *env) liveNumbers() []uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var ns []uint64
	for n := range numTargets {
		if st, err := e.status(ctx, n); err == nil {
			ns = append(ns, st.GetEpoch(), st.GetVoteEpoch(), st.GetLastLsn(), st.GetDurableLsn(), st.GetWalFirstLsn())
		}
	}
	return ns
}

// run sends in and judges what comes back.
func (e *env) run(in input, seeds map[string][][]byte) outcome {
	n, c := in.target(), in.class()
	md := e.methods[in.Method]
	sc := e.plan(in, md, seeds)
	out := outcome{sent: sc.frames}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	out.code, out.message, out.ended = e.call(n, c, in.Method, sc, &out)
	runtime.ReadMemStats(&after)
	out.alloc = after.TotalAlloc - before.TotalAlloc
	e.judge(in, md, &out)
	return out
}

// call runs one call as sc says and returns its status.
func (e *env) call(n target, c class, method string, sc script, out *outcome) (codes.Code, string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var endedBy atomic.Bool
	end := func() { endedBy.Store(true); cancel() }
	idle := time.AfterFunc(time.Hour, end)
	defer idle.Stop()
	md := e.methods[method]
	streaming := md == nil || md.IsStreamingClient() || md.IsStreamingServer()
	if streaming {
		idle.Reset(streamIdle)
	}
	desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
	st, err := e.conns[c][n].NewStream(ctx, desc, method, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return e.code(err, endedBy.Load())
	}
	for i, f := range sc.frames {
		if i == sc.cancelAt {
			end()
			break
		}
		if err := st.SendMsg(&f); err != nil {
			break // the status comes from RecvMsg
		}
	}
	if sc.cancelAt == len(sc.frames) {
		end()
	}
	// No half-close on a call the harness ended: gRPC's transport can send
	// it after dropping the message still queued (the cancel removes the
	// stream's pending data), and the server then answers a
	// server-streaming call INTERNAL ("cardinality violation: received no
	// request message") — a harness artefact, not walship's answer.
	if sc.halfClose && !endedBy.Load() {
		_ = st.CloseSend()
	}
	for {
		var resp []byte
		err := st.RecvMsg(&resp)
		if err == io.EOF {
			return codes.OK, "", endedBy.Load()
		}
		if err != nil {
			return e.code(err, endedBy.Load())
		}
		out.received++
		out.recvd += len(resp)
		if md != nil {
			m := newMessage(md.Output())
			if err := proto.Unmarshal(resp, m.Interface()); err != nil {
				out.problems = append(out.problems, fmt.Sprintf("response %d does not decode as %s: %v", out.received, md.Output().FullName(), err))
			}
		}
		if streaming {
			idle.Reset(streamIdle)
		}
		if out.received >= sc.maxRecv {
			end()
		}
	}
}

func (e *env) code(err error, ended bool) (codes.Code, string, bool) {
	s, ok := status.FromError(err)
	if !ok {
		if errors.Is(err, context.Canceled) {
			return codes.Canceled, err.Error(), ended
		}
		return codes.Unknown, "not a status: " + err.Error(), ended
	}
	return s.Code(), s.Message(), ended
}

// allocBudget is how much the whole process (servers and harness) may
// allocate for one call: a generous multiple of what went over the wire,
// plus room for what runs meanwhile (heartbeats, replication of earlier
// writes). A request that makes a server build far more than it receives
// or answers (a response amplified in memory and then refused) exceeds it.
func allocBudget(sent [][]byte, recvd int) uint64 {
	total := recvd
	for _, f := range sent {
		total += len(f)
	}
	return 64<<20 + 32*uint64(total)
}

// judge records in out.problems what is wrong with the call's outcome.
func (e *env) judge(in input, md protoreflect.MethodDescriptor, out *outcome) {
	n, c := in.target(), in.class()
	served := md != nil && e.served[n][in.Method]
	bad := func(format string, args ...any) { out.problems = append(out.problems, fmt.Sprintf(format, args...)) }
	switch {
	case out.code == codes.Unimplemented:
		// Right for a method the server does not serve, and for one a
		// role registers without implementing (a replica's Switchover).
	case out.code == codes.Internal && !validHeaderValue(in.Method) && strings.Contains(out.message, "RST_STREAM"):
		// A method name with a control character is not a valid HTTP/2
		// :path: the server's HTTP/2 layer resets the stream
		// (PROTOCOL_ERROR) before gRPC, let alone walship, sees a call.
	case !served && out.code != codes.Canceled && out.code != codes.DeadlineExceeded && out.code != codes.Unavailable:
		bad("%s from a method %s does not register (want UNIMPLEMENTED)", out.code, e.name(n))
	case out.code == codes.DataLoss:
		if !dataLossMethods()[in.Method] {
			bad("DATA_LOSS, but the harness damaged no stored data")
		}
	case !allowedCodes()[out.code]:
		bad("%s is never a right answer", out.code)
		return // the one problem; what follows would restate it
	}
	if served && !e.mayCall(c, in.Method) {
		// The policy refuses c: nothing but a refusal may come back (or
		// a transport-level answer: a message too large, a cancel).
		switch out.code {
		case codes.PermissionDenied, codes.ResourceExhausted, codes.Unavailable, codes.Canceled, codes.DeadlineExceeded, codes.Unimplemented:
		default:
			bad("%s for a %s certificate, which the policy refuses %s (want PERMISSION_DENIED)", out.code, c, in.Method)
		}
		if out.received > 0 {
			bad("%d responses to a %s certificate, which the policy refuses %s", out.received, c, in.Method)
		}
	}
	if out.code == codes.InvalidArgument && strings.TrimSpace(out.message) == "" {
		bad("INVALID_ARGUMENT without a message naming the field")
	}
	if served && md != nil && !md.IsStreamingServer() && out.code == codes.OK && out.received != 1 {
		bad("%d responses to a unary call", out.received)
	}
	if budget := allocBudget(out.sent, out.recvd); out.alloc > budget {
		bad("the process allocated %d MiB for this call (budget %d MiB for %d bytes sent and %d received): a response amplified in memory",
			out.alloc>>20, budget>>20, size(out.sent), out.recvd)
	}
}

func size(frames [][]byte) int {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	return n
}

// describe is a reproducer of in and what it did, for a report: the
// server, the class, the method, every message sent (as text when it
// decodes, else its size and first bytes) and the answer.
func (e *env) describe(in input, out outcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s on %s as %s (seed %d): %s %q", in.Method, e.name(in.target()), in.class(), in.Seed, out.code, trim(out.message, 300))
	if out.ended {
		b.WriteString(" (the harness ended the call)")
	}
	md := e.methods[in.Method]
	for i, f := range out.sent {
		fmt.Fprintf(&b, "\n    message %d, %d bytes: %s", i+1, len(f), showFrame(f, md))
	}
	return b.String()
}

// showFrame shows a sent message: as text if it decodes, plus what made
// it not decode.
func showFrame(f []byte, md protoreflect.MethodDescriptor) string {
	if md == nil {
		return fmt.Sprintf("%x", f[:min(len(f), 48)])
	}
	m := newMessage(md.Input())
	if err := proto.Unmarshal(f, m.Interface()); err != nil {
		return fmt.Sprintf("does not decode (%v); first bytes %x", err, f[:min(len(f), 48)])
	}
	return trim(prototext.MarshalOptions{}.Format(m.Interface()), 400)
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("... (%d bytes)", len(s))
}

// validHeaderValue reports whether v may be an HTTP/2 header field value
// (RFC 9113 §8.2.1 as Go's HTTP/2 server checks it: no control character
// but a tab).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; (b < 0x20 && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}
