package grpcfuzz

import (
	"bytes"
	"hash/crc32"
	"math"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The fixture every cluster holds before the harness starts (and again
// after each batch's cleanup): seeds read, compare and copy these keys.
const (
	smallKey = "fuzz/a"
	bigKey   = "fuzz/big"
)

// seed is a valid request: where to send it and as whom (a class the
// policy allows, so it reaches the handler).
type seed struct {
	node   target
	class  class
	method string
	msg    proto.Message
}

// seeds are valid requests of every method walship's servers serve, one
// or more each, with ${...} templates for live values (see input.Msg).
// bigValue is the size of the fixture's large value.
func seeds(bigValue int) []seed {
	epoch := uint64(1) // a new cluster's; the mutator tries the live ones
	policy := &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_SYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC,
		SyncReplicas: 1, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_APPLY, Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC, SyncTimeout: durationpb.New(time.Second)}
	get := func(k string) *walshipv1.TxnOp {
		return &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Get{Get: &walshipv1.GetOp{Key: k}}}
	}
	// A Txn at the ops limit, every op a get of the large value: valid,
	// and the largest response a request can ask for.
	var manyGets []*walshipv1.TxnOp
	for range 1000 {
		manyGets = append(manyGets, get(bigKey))
	}
	payload := []byte{0x81, 0xa1, 'k', 0xa1, 'v'} // a msgpack map: not a real record, checked by CRC only
	batch := &walshipv1.WalBatch{Epoch: epoch, FirstLsn: 1_000_000, LastLsn: 1_000_000, PrevLsn: 999_999, Codec: walshipv1.Codec_CODEC_MSGPACK,
		Payload: payload, Crc32C: crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli)), CommitTimeUnixNano: 1}
	hb := &walshipv1.Heartbeat{Epoch: epoch, LastLsn: 1, TimeUnixNano: 1, ReplyRequested: true, PrimaryAddr: "${primary_addr}",
		PrimaryId: "primary", ClusterId: "${cluster_id}"}
	snapHeader := &walshipv1.SnapshotHeader{Epoch: epoch, Lsn: 1, Keys: 1, ClusterId: "${cluster_id}", CommitTimeUnixNano: 1,
		History: []*walshipv1.EpochStart{{Epoch: epoch, FirstLsn: 1}}}
	reflect := func(r *reflectionv1.ServerReflectionRequest) proto.Message { return r }
	var s []seed
	add := func(n target, c class, method string, msgs ...proto.Message) {
		for _, m := range msgs {
			s = append(s, seed{n, c, method, m})
		}
	}
	kv := "/walship.v1.KVService/"
	add(targetPrimary, classClient, kv+"Put",
		&walshipv1.PutRequest{Key: smallKey, Value: []byte("v")},
		&walshipv1.PutRequest{Key: "fuzz/p", Value: bytes.Repeat([]byte{'v'}, bigValue), Policy: policy})
	add(targetPrimary, classClient, kv+"Delete", &walshipv1.DeleteRequest{Key: "fuzz/p"})
	add(targetPrimary, classClient, kv+"Get",
		&walshipv1.GetRequest{Key: smallKey},
		&walshipv1.GetRequest{Key: bigKey, RequirePrimary: true})
	add(targetReplica, classClient, kv+"Get",
		&walshipv1.GetRequest{Key: smallKey, MinLsn: 1, WaitTimeout: durationpb.New(100 * time.Millisecond)})
	add(targetPrimary, classClient, kv+"Txn",
		&walshipv1.TxnRequest{
			Compares: []*walshipv1.Compare{{Key: smallKey, Target: walshipv1.CompareTarget_COMPARE_TARGET_EXISTS,
				Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_Exists{Exists: true}}},
			Success: []*walshipv1.TxnOp{
				{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: "fuzz/t", Value: []byte("x")}}},
				{Op: &walshipv1.TxnOp_Delete{Delete: &walshipv1.DeleteOp{Key: "fuzz/t"}}},
				get(smallKey),
			},
			Failure: []*walshipv1.TxnOp{get(bigKey)},
		},
		&walshipv1.TxnRequest{Success: manyGets, Speculative: true})
	// Pipeline: a stream of several kinds of operation (the plan mixes
	// the seeds of one method), a replica refusing its writes.
	add(targetPrimary, classClient, kv+"Pipeline",
		&walshipv1.PipelineRequest{Id: 1, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "fuzz/q", Value: []byte("v"), Policy: policy}}},
		&walshipv1.PipelineRequest{Id: 2, Op: &walshipv1.PipelineRequest_Delete{Delete: &walshipv1.DeleteRequest{Key: "fuzz/q"}}, Timeout: durationpb.New(time.Second)},
		&walshipv1.PipelineRequest{Id: 3, Op: &walshipv1.PipelineRequest_Txn{Txn: &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{get(smallKey)}}}},
		&walshipv1.PipelineRequest{Id: 4, Op: &walshipv1.PipelineRequest_Get{Get: &walshipv1.GetRequest{Key: bigKey, RequirePrimary: true}}},
		// Several operations in one message.
		&walshipv1.PipelineRequest{Id: 5, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "fuzz/r", Value: []byte("v")}},
			More: []*walshipv1.PipelineRequest{
				{Id: 6, Op: &walshipv1.PipelineRequest_Get{Get: &walshipv1.GetRequest{Key: "fuzz/r"}}},
				{Id: 7, Op: &walshipv1.PipelineRequest_Cancel{Cancel: &walshipv1.PipelineCancel{}}},
				{Id: 8, Op: &walshipv1.PipelineRequest_Delete{Delete: &walshipv1.DeleteRequest{Key: "fuzz/r"}}, Timeout: durationpb.New(time.Second)},
			}})
	add(targetReplica, classClient, kv+"Pipeline",
		&walshipv1.PipelineRequest{Id: 1, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "fuzz/q"}}},
		&walshipv1.PipelineRequest{Id: 2, Op: &walshipv1.PipelineRequest_Get{Get: &walshipv1.GetRequest{Key: smallKey}}})
	add(targetPrimary, classClient, kv+"Scan", &walshipv1.ScanRequest{Start: "fuzz/", End: "fuzz0", Limit: 10})
	add(targetReplica, classClient, kv+"Scan", &walshipv1.ScanRequest{})
	add(targetPrimary, classClient, kv+"Watch", &walshipv1.WatchRequest{Prefix: "fuzz/", StartLsn: 1, PrevValues: true, ProgressInterval: durationpb.New(50 * time.Millisecond)})
	add(targetReplica, classClient, kv+"Watch", &walshipv1.WatchRequest{Key: "fuzz/a"})

	admin := "/walship.v1.AdminService/"
	add(targetPrimary, classAdmin, admin+"Status", &walshipv1.StatusRequest{})
	add(targetLogStore, classClient, admin+"Status", &walshipv1.StatusRequest{})
	add(targetReplica, classAdmin, admin+"Promote", &walshipv1.PromoteRequest{DryRun: true}, &walshipv1.PromoteRequest{})
	add(targetPrimary, classAdmin, admin+"Switchover", &walshipv1.SwitchoverRequest{Target: "replica-0", Timeout: durationpb.New(2 * time.Second)})
	add(targetPrimary, classAdmin, admin+"SetPolicy", &walshipv1.SetPolicyRequest{Policy: policy})
	add(targetPrimary, classAdmin, admin+"ListMembers", &walshipv1.ListMembersRequest{})
	add(targetPrimary, classAdmin, admin+"ChangeMembers", &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Remove{Remove: "no-such-member"}},
		&walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_RemoveLogstore{RemoveLogstore: "no-such-logstore:1"}},
		&walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_ReplaceLogstore{ReplaceLogstore: &walshipv1.LogStoreReplacement{Old: "no-such-logstore:1", New: "127.0.0.1:1"}}})

	add(targetReplica, classNode, "/walship.v1.EpochService/Fence",
		&walshipv1.FenceRequest{Epoch: epoch + 1, CandidateId: "replica-0", CandidateAddr: "${replica_addr}", ClusterId: "${cluster_id}"})

	add(targetLogStore, classNode, "/walship.v1.EpochService/Elect",
		&walshipv1.ElectRequest{Op: walshipv1.ElectOp_ELECT_OP_READ},
		&walshipv1.ElectRequest{Op: walshipv1.ElectOp_ELECT_OP_CAMPAIGN, CandidateId: "replica-0", Term: 1, Create: true, Lease: durationpb.New(time.Second)},
		&walshipv1.ElectRequest{Op: walshipv1.ElectOp_ELECT_OP_RENEW, CandidateId: "replica-0", Term: 1, Lease: durationpb.New(time.Second)})

	repl := "/walship.v1.ReplicationService/"
	add(targetPrimary, classNode, repl+"Stream",
		&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{ReplicaId: "fuzz-r", Epoch: epoch, NextLsn: 1,
			FencedEpoch: epoch, History: []*walshipv1.EpochStart{{Epoch: epoch, FirstLsn: 1}}, ClusterId: "${cluster_id}"}}},
		&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: &walshipv1.ReplicaAck{WrittenLsn: 1, FlushedLsn: 1, AppliedLsn: 1, TimeUnixNano: 1}}},
		&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Heartbeat{Heartbeat: hb}})
	add(targetPrimary, classNode, repl+"Snapshot", &walshipv1.SnapshotRequest{ReplicaId: "fuzz-r"})

	ls := "/walship.v1.LogStoreService/"
	add(targetLogStore, classNode, ls+"Append",
		&walshipv1.AppendRequest{Heartbeat: hb},
		&walshipv1.AppendRequest{Batch: batch},
		&walshipv1.AppendRequest{Truncate: true})
	add(targetLogStore, classNode, ls+"Read",
		&walshipv1.ReadRequest{FromLsn: 1, ToLsn: 10, ClusterId: "${cluster_id}"},
		&walshipv1.ReadRequest{FromLsn: 1, Follow: true})
	add(targetLogStore, classLogStore, ls+"Status", &walshipv1.LogStoreServiceStatusRequest{})
	add(targetLogStore, classNode, ls+"PutSnapshot",
		&walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Header{Header: snapHeader}},
		&walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Chunk{Chunk: &walshipv1.SnapshotChunk{
			Kvs: []*walshipv1.KeyValue{{Key: "fuzz/s", Value: []byte("v"), VersionLsn: 1}}}}},
		&walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Trailer{Trailer: &walshipv1.SnapshotTrailer{StateDigest: "00"}}})
	add(targetLogStore, classAdmin, ls+"GetSnapshot", &walshipv1.GetSnapshotRequest{AtMostLsn: 1 << 40, ClusterId: "${cluster_id}"})
	add(targetLogStore, classAdmin, ls+"Verify", &walshipv1.VerifyRequest{})

	health := "/grpc.health.v1.Health/"
	add(targetReplica, classNoID, health+"Check", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckRequest{Service: "walship.v1.KVService"})
	add(targetPrimary, classNoID, health+"List", &healthpb.HealthListRequest{})
	add(targetLogStore, classNoID, health+"Watch", &healthpb.HealthCheckRequest{Service: "walship.v1.LogStoreService"})

	add(targetPrimary, classClient, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
		reflect(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}),
		reflect(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_FileContainingSymbol{
			FileContainingSymbol: "walship.v1.KVService"}}),
		reflect(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_FileByFilename{
			FileByFilename: "walship/v1/kv.proto"}}),
		reflect(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_AllExtensionNumbersOfType{
			AllExtensionNumbersOfType: "walship.v1.PutRequest"}}))
	add(targetReplica, classAdmin, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
		&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_FileContainingSymbol{
			FileContainingSymbol: "walship.v1.LogStoreService"}})
	return s
}

// seedFrames are the seeds' messages by method, in wire format: the
// other messages a stream's script may send.
func seedFrames(ss []seed) map[string][][]byte {
	out := map[string][][]byte{}
	for _, s := range ss {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.msg)
		if err != nil {
			panic(err) // the seeds above are valid messages
		}
		out[s.method] = append(out[s.method], b)
	}
	return out
}

// seedInput is s as a fuzz input (Seed 0: sent as it is).
func seedInput(s seed) input {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.msg)
	if err != nil {
		panic(err)
	}
	return input{Node: uint8(s.node), Method: s.method, Class: uint8(s.class), Msg: b}
}

// extremeInputs are s with each integer field (at the top or one message
// down) set to the largest value of its type, unsigned 64-bit ones also
// to 2^63-1 (the largest an int64 holds, a natural bound to pick), and
// signed ones to -1: the epochs, LSNs, limits and counts nothing may
// wrap around or get stuck at.
func extremeInputs(s seed) []input {
	var out []input
	var visit func(m protoreflect.Message, depth int)
	root := proto.Clone(s.msg).ProtoReflect()
	visit = func(m protoreflect.Message, depth int) {
		fields := m.Descriptor().Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if fd.IsList() || fd.IsMap() {
				continue
			}
			if fd.Message() != nil {
				if depth == 0 && m.Has(fd) {
					visit(m.Mutable(fd).Message(), depth+1)
				}
				continue
			}
			var vals []protoreflect.Value
			switch fd.Kind() {
			case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
				vals = []protoreflect.Value{protoreflect.ValueOfUint64(math.MaxUint64), protoreflect.ValueOfUint64(math.MaxInt64)}
			case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
				vals = []protoreflect.Value{protoreflect.ValueOfUint32(math.MaxUint32)}
			case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
				vals = []protoreflect.Value{protoreflect.ValueOfInt64(math.MaxInt64), protoreflect.ValueOfInt64(-1)}
			case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
				vals = []protoreflect.Value{protoreflect.ValueOfInt32(math.MaxInt32), protoreflect.ValueOfInt32(-1)}
			}
			for _, v := range vals {
				old, had := m.Get(fd), m.Has(fd)
				m.Set(fd, v)
				b, err := proto.MarshalOptions{Deterministic: true}.Marshal(root.Interface())
				if err != nil {
					panic(err)
				}
				out = append(out, input{Node: uint8(s.node), Method: s.method, Class: uint8(s.class), Msg: b})
				if had {
					m.Set(fd, old)
				} else {
					m.Clear(fd)
				}
			}
		}
	}
	visit(root, 0)
	return out
}
