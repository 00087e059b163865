package serve

import (
	"context"
	"errors"
	"fmt"
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

// Keys are proto3 strings, and the protobuf runtime refuses a request whose
// string holds invalid UTF-8 before any handler runs; gRPC then reports it as
// INTERNAL with no field name. utf8Codec turns that into what it is, a bad
// argument: the call fails INVALID_ARGUMENT naming the offending field
// ("success[2].put.key: not valid UTF-8"), unary or streaming.
//
// Nothing is kept between the codec and the interceptors: a map from
// request to error, emptied by an interceptor, kept every request whose
// interceptor never ran — a call the authorization policy refused, every
// message of a stream — and with it what had been decoded (up to the
// message limit), for good. gRPC decodes a unary request before any
// interceptor runs and reports any codec error as INTERNAL, so the codec
// cannot fail the call itself. Instead it empties the message and leaves in
// it a single unknown field, utf8Mark, holding the error, and reports
// success; utf8Unary, and utf8Stream around every RecvMsg, refuse a message
// so marked. Every other message costs them a length test of its unknown
// fields. The codec replaces a mark a client sends itself with a refusal of
// its own, so a client can make the server refuse its call and nothing
// else: never put its own words in the server's answer.
type utf8Codec struct {
	inner encoding.CodecV2
}

// utf8Mark is the unknown field that carries a decoding refusal. It is in
// the range protobuf reserves for itself (19000-19999), which no .proto may
// declare.
const utf8Mark protowire.Number = 19_000

func newUTF8Codec() utf8Codec {
	return utf8Codec{inner: encoding.GetCodecV2(proto.Name)}
}

func (c utf8Codec) Name() string { return proto.Name }

func (c utf8Codec) Marshal(v any) (mem.BufferSlice, error) { return c.inner.Marshal(v) }

func (c utf8Codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.inner.Unmarshal(data, v)
	m, ok := v.(protov2.Message)
	if !ok {
		return err
	}
	if err == nil {
		if u := m.ProtoReflect().GetUnknown(); len(u) > 0 && hasField(u, utf8Mark) {
			mark(m, fmt.Sprintf("field %d: reserved for protobuf, not to be sent", utf8Mark))
		}
		return nil
	}
	var u interface{ InvalidUTF8() bool }
	if !errors.As(err, &u) || !u.InvalidUTF8() {
		return err
	}
	field := invalidUTF8Field(data.Materialize(), m.ProtoReflect().Descriptor())
	if field == "" {
		field = "request"
	}
	mark(m, field+": not valid UTF-8")
	return nil
}

// mark empties m, dropping whatever was decoded, and leaves in it only
// utf8Mark holding msg.
func mark(m protov2.Message, msg string) {
	protov2.Reset(m)
	m.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, utf8Mark, protowire.BytesType), msg))
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
	if num != utf8Mark || typ != protowire.BytesType {
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

// utf8Unary answers a request the codec marked without calling the handler.
func utf8Unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := marked(req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// utf8Stream makes RecvMsg fail on a message the codec marked: the
// handler sees the error, never the message.
func utf8Stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, utf8Checked{ss})
}

type utf8Checked struct{ grpc.ServerStream }

func (s utf8Checked) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return marked(m)
}

// invalidUTF8Field walks wire-format b as message md and returns the path of
// the first string field holding invalid UTF-8, or "".
func invalidUTF8Field(b []byte, md protoreflect.MessageDescriptor) string {
	counts := map[protowire.Number]int{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return ""
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		name := string(fd.Name())
		if fd.IsList() {
			name = fmt.Sprintf("%s[%d]", name, counts[num])
			counts[num]++
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(v) {
				return name
			}
		case protoreflect.MessageKind:
			if sub := invalidUTF8Field(v, fd.Message()); sub != "" {
				return name + "." + sub
			}
		}
	}
	return ""
}
