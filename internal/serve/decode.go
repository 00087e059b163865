package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	protov2 "google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A request that does not decode — invalid UTF-8 in a proto3 string, a
// truncated field, a wire type or field number that does not exist — is
// refused by the protobuf runtime before any handler runs, and gRPC then
// reports it as INTERNAL with no field name, for a unary call before any
// interceptor runs: a caller the policy refuses would learn INTERNAL, not
// PERMISSION_DENIED. checkedCodec turns it into what it is, a bad argument,
// after authorization: the call fails INVALID_ARGUMENT naming the field
// where there is one ("success[2].put.key: not valid UTF-8", "request:
// malformed protobuf: success[2].put.value: truncated"), unary or
// streaming, on every message of a stream.
//
// Nothing is kept between the codec and the interceptors: a map from
// request to error, emptied by an interceptor, kept every request whose
// interceptor never ran — a call the authorization policy refused, every
// message of a stream — and with it what had been decoded (up to the
// message limit), for good. gRPC decodes a unary request before any
// interceptor runs and reports any codec error as INTERNAL, so the codec
// cannot fail the call itself. Instead it empties the message and leaves in
// it a single unknown field, refusalMark, holding the error, and reports
// success; refuseMarkedUnary, and refuseMarkedStream around every RecvMsg,
// refuse a message so marked. Every other message costs them a length test
// of its unknown fields, and the codec nothing more than protobuf's
// decoding: where a request went wrong is found by walking it again, only
// once protobuf has refused it. The codec replaces a mark a client sends
// itself with a refusal of its own, so a client can make the server refuse
// its call and nothing else: never put its own words in the server's
// answer.
//
// What gRPC refuses before the codec is left as it is: a message over the
// receive limit (RESOURCE_EXHAUSTED), a compressed one (the server has no
// decompressor: UNIMPLEMENTED), and framing errors — a message cut short by
// the end of the stream, a unary call with no request or with two
// (INTERNAL, as gRPC words them).
type checkedCodec struct {
	inner encoding.CodecV2
}

// refusalMark is the unknown field that carries a decoding refusal. It is in
// the range protobuf reserves for itself (19000-19999), which no .proto may
// declare.
const refusalMark protowire.Number = 19_000

func newCheckedCodec() checkedCodec {
	return checkedCodec{inner: encoding.GetCodecV2(proto.Name)}
}

func (c checkedCodec) Name() string { return proto.Name }

// preEncoded is a message that carries its own encoding, sent as it is:
// a Watch's run of transactions, made of encodings shared by every watcher
// of the same keys (internal/changefeed), which marshalling would copy
// once per watcher.
type preEncoded interface {
	EncodedBuffers() mem.BufferSlice
}

func (c checkedCodec) Marshal(v any) (mem.BufferSlice, error) {
	if p, ok := v.(preEncoded); ok {
		return p.EncodedBuffers(), nil
	}
	return c.inner.Marshal(v)
}

func (c checkedCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.inner.Unmarshal(data, v)
	m, ok := v.(protov2.Message)
	if !ok {
		return err
	}
	if err == nil {
		if u := m.ProtoReflect().GetUnknown(); len(u) > 0 && hasField(u, refusalMark) {
			mark(m, fmt.Sprintf("field %d: reserved for protobuf, not to be sent", refusalMark))
		}
		return nil
	}
	mark(m, refusal(data, m.ProtoReflect().Descriptor(), err))
	return nil
}

// refusal is what the caller of a request that protobuf refused with err
// is told: where and why, found by walking the request again, else
// protobuf's own words.
func refusal(data mem.BufferSlice, md protoreflect.MessageDescriptor, err error) string {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	const prefix = "request: malformed protobuf: "
	switch where, why := malformed(buf.ReadOnlyData(), md, 0); {
	case why == "":
		return prefix + err.Error()
	case why == notUTF8:
		return where + ": " + why
	case where == "":
		return prefix + why
	default:
		return prefix + where + ": " + why
	}
}

// mark empties m, dropping whatever was decoded, and leaves in it only
// refusalMark holding msg.
func mark(m protov2.Message, msg string) {
	protov2.Reset(m)
	m.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, refusalMark, protowire.BytesType), msg))
}

// marked is the INVALID_ARGUMENT error of a message the codec marked, else
// nil. The codec's mark is the message's only unknown field.
func marked(v any) error {
	m, ok := v.(protov2.Message)
	if !ok {
		return nil
	}
	u := m.ProtoReflect().GetUnknown()
	if len(u) == 0 {
		return nil
	}
	num, typ, n := protowire.ConsumeTag(u)
	if num != refusalMark || typ != protowire.BytesType {
		return nil
	}
	msg, _ := protowire.ConsumeBytes(u[n:])
	return status.Error(codes.InvalidArgument, string(msg))
}

// hasField reports whether wire-format b holds field num.
func hasField(b []byte, num protowire.Number) bool {
	for len(b) > 0 {
		n0, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		if n0 == num {
			return true
		}
		b = b[n:]
		if n = protowire.ConsumeFieldValue(n0, typ, b); n < 0 {
			return false
		}
		b = b[n:]
	}
	return false
}

// refuseMarkedUnary answers a request the codec marked without calling the
// handler.
func refuseMarkedUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := marked(req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// refuseMarkedStream makes RecvMsg fail on a message the codec marked: the
// handler sees the error, never the message.
func refuseMarkedStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, checkedStream{ss})
}

type checkedStream struct{ grpc.ServerStream }

func (s checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return marked(m)
}

// notUTF8 is why a string field does not decode.
const notUTF8 = "not valid UTF-8"

// malformed walks wire-format b as message md, depth messages deep, as
// protobuf decodes it, and returns the first thing protobuf would refuse:
// where (the path of the field; "" for b itself) and why. It returns two
// empty strings if it finds nothing.
func malformed(b []byte, md protoreflect.MessageDescriptor, depth int) (where, why string) {
	if depth >= protowire.DefaultRecursionLimit {
		return "", "messages nested too deep"
	}
	var elems map[protowire.Number]int // elements so far of each repeated field
	for len(b) > 0 {
		tag, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return "", "field tag: " + valueError(protowire.VarintType, n)
		}
		num, typ := protowire.Number(tag>>3), protowire.Type(tag&7)
		if tag>>3 < uint64(protowire.MinValidNumber) || tag>>3 > uint64(protowire.MaxValidNumber) {
			return "", fmt.Sprintf("field tag: field number %d is not in %d..%d", tag>>3, protowire.MinValidNumber, protowire.MaxValidNumber)
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		elem, packed := -1, false
		if fd != nil && fd.Cardinality() == protoreflect.Repeated {
			packed = typ == protowire.BytesType && packable(fd.Kind())
			if !packed {
				if elems == nil {
					elems = map[protowire.Number]int{}
				}
				elem = elems[num]
				elems[num]++
			}
		}
		var below string
		if fd != nil && typ == protowire.BytesType {
			var v []byte
			if v, n = protowire.ConsumeBytes(b); n < 0 {
				why = valueError(typ, n)
			} else {
				switch k := fd.Kind(); {
				case k == protoreflect.StringKind && checksUTF8(fd) && !utf8.Valid(v):
					why = notUTF8
				case k == protoreflect.MessageKind:
					below, why = malformed(v, fd.Message(), depth+1)
				case packed:
					why = packedProblem(v, k)
				}
			}
		} else if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			why = valueError(typ, n)
		}
		if why != "" {
			return fieldPath(fd, num, elem, below), why
		}
		b = b[n:]
	}
	return "", ""
}

// fieldPath names field num of a message (fd, nil if unknown), its
// element elem (-1: not an element), then the path below it.
func fieldPath(fd protoreflect.FieldDescriptor, num protowire.Number, elem int, below string) string {
	name := fmt.Sprintf("field %d", num)
	if fd != nil {
		name = string(fd.Name())
	}
	if elem >= 0 {
		name = fmt.Sprintf("%s[%d]", name, elem)
	}
	if below != "" {
		name += "." + below
	}
	return name
}

// valueError is why protowire could not consume a value of wire type typ
// (n < 0), in words of our own: protobuf's vary on purpose.
func valueError(typ protowire.Type, n int) string {
	switch {
	case errors.Is(protowire.ParseError(n), io.ErrUnexpectedEOF):
		return "truncated"
	case typ == protowire.VarintType:
		return "varint overflows 64 bits" // a varint's one other error
	case typ == protowire.BytesType:
		return "length overflows 64 bits"
	case typ == protowire.StartGroupType:
		return "group does not parse"
	case typ == protowire.EndGroupType:
		return "end of a group that was never started"
	default:
		return fmt.Sprintf("wire type %d does not exist", typ)
	}
}

// checksUTF8 is whether protobuf refuses invalid UTF-8 in string field fd:
// in proto3, or under editions' utf8_validation = VERIFY, as its decoder
// decides.
func checksUTF8(fd protoreflect.FieldDescriptor) bool {
	if e, ok := fd.(interface{ EnforceUTF8() bool }); ok && fd.Syntax() == protoreflect.Editions {
		return e.EnforceUTF8()
	}
	return fd.Syntax() == protoreflect.Proto3
}

// packable is whether a repeated field of kind k may be packed: a scalar
// number.
func packable(k protoreflect.Kind) bool {
	switch k {
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind, protoreflect.GroupKind:
		return false
	}
	return true
}

// packedProblem is why packed values v of kind k do not decode, or "".
func packedProblem(v []byte, k protoreflect.Kind) string {
	var size int
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		size = 4
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		size = 8
	default:
		for len(v) > 0 {
			_, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return "packed values: " + valueError(protowire.VarintType, n)
			}
			v = v[n:]
		}
		return ""
	}
	if len(v)%size != 0 {
		return fmt.Sprintf("packed values: %d bytes, not a multiple of %d", len(v), size)
	}
	return ""
}
