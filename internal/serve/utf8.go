package serve

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
// argument: it finds the offending field and the unary interceptor answers
// INVALID_ARGUMENT naming it ("success[2].put.key: not valid UTF-8").
type utf8Codec struct {
	inner encoding.CodecV2
	bad   *sync.Map // request message → error, for the interceptor
}

func newUTF8Codec() utf8Codec {
	return utf8Codec{inner: encoding.GetCodecV2(proto.Name), bad: &sync.Map{}}
}

func (c utf8Codec) Name() string { return proto.Name }

func (c utf8Codec) Marshal(v any) (mem.BufferSlice, error) { return c.inner.Marshal(v) }

func (c utf8Codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.inner.Unmarshal(data, v)
	var u interface{ InvalidUTF8() bool }
	if err == nil || !errors.As(err, &u) || !u.InvalidUTF8() {
		return err
	}
	m, ok := v.(protov2.Message)
	if !ok {
		return err
	}
	field := invalidUTF8Field(data.Materialize(), m.ProtoReflect().Descriptor())
	if field == "" {
		field = "request"
	}
	c.bad.Store(v, status.Errorf(codes.InvalidArgument, "%s: not valid UTF-8", field))
	return nil
}

// interceptor answers a request the codec found invalid without calling the handler.
func (c utf8Codec) interceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if e, ok := c.bad.LoadAndDelete(req); ok {
		return nil, e.(error)
	}
	return handler(ctx, req)
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
