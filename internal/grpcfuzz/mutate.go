package grpcfuzz

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Mutator changes protobuf messages the way a hostile or broken peer
// would: it knows the schema (protoreflect), so most of what it sends
// parses and reaches the handlers, past the codec; and it works on the wire
// format too, for what a generated client could never send (invalid UTF-8
// in a string field, unknown fields, wrong wire types, truncated frames,
// noise). Everything it does is drawn from its rand.Rand, so a seed
// replays it.
type Mutator struct {
	r *rand.Rand
	// MaxBytes bounds a huge field: the largest message it builds is
	// about this size (the target's receive limit, or a little more, to
	// see it refused).
	MaxBytes int
	// Strings are values worth trying in string fields besides random
	// ones: live keys, ids, addresses, the cluster's id.
	Strings []string
	// Numbers are values worth trying in integer fields besides the
	// extremes: live epochs and LSNs.
	Numbers []uint64
}

// NewMutator returns a Mutator drawing from r.
func NewMutator(r *rand.Rand, maxBytes int) *Mutator {
	return &Mutator{r: r, MaxBytes: maxBytes}
}

// extremes are integers at the edges of every width, signed and not.
func extremes() []uint64 {
	return []uint64{0, 1, 2, math.MaxUint64, math.MaxUint64 - 1, math.MaxInt64, math.MaxInt64 + 1,
		math.MaxUint32, math.MaxUint32 + 1, math.MaxInt32, math.MaxInt32 + 1, 1 << 53, 1 << 40, 1000, 1001, 10000}
}

// Message applies between 1 and n random schema-aware mutations to m.
func (mu *Mutator) Message(m protoreflect.Message, n int) {
	k := 1 + mu.r.IntN(max(n, 1))
	for range k {
		mu.mutateOne(m, 0)
	}
}

// mutateOne changes one field of m, or of a message below it.
func (mu *Mutator) mutateOne(m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	if fields.Len() == 0 {
		return
	}
	fd := fields.Get(mu.r.IntN(fields.Len()))
	switch {
	case fd.IsMap():
		if mu.r.IntN(2) == 0 {
			m.Clear(fd)
			return
		}
		mp := m.Mutable(fd).Map()
		for range 1 + mu.r.IntN(4) {
			k := mu.scalar(fd.MapKey(), protoreflect.Value{})
			mp.Set(k.MapKey(), mu.value(mp.NewValue(), fd.MapValue(), depth))
		}
	case fd.IsList():
		mu.list(m, fd, depth)
	case fd.Message() != nil:
		switch {
		case mu.r.IntN(6) == 0:
			m.Clear(fd)
		case mu.r.IntN(6) == 0 || depth > 6:
			m.Set(fd, protoreflect.ValueOfMessage(m.NewField(fd).Message()))
		default:
			mu.mutateOne(m.Mutable(fd).Message(), depth+1)
		}
	default:
		// A oneof member set here clears its siblings: another kind of
		// message on a stream, another operand of a Compare.
		m.Set(fd, mu.scalar(fd, m.Get(fd)))
	}
}

// list mutates the repeated field fd of m: an element more, many more (a
// huge repeated field within MaxBytes), an element changed, removed, or
// none left.
func (mu *Mutator) list(m protoreflect.Message, fd protoreflect.FieldDescriptor, depth int) {
	l := m.Mutable(fd).List()
	switch op := mu.r.IntN(6); {
	case op == 0:
		m.Clear(fd)
	case op == 1 && l.Len() > 0:
		// Repeat what is there until the message is about MaxBytes, or
		// at most 20,000 elements more: a Txn of thousands of gets of
		// one large value, a history of thousands of entries.
		each := max(1, proto.Size(m.Interface())/max(1, l.Len()))
		n := min(20000, mu.MaxBytes/each)
		if mu.r.IntN(2) == 0 {
			n = min(n, 1+mu.r.IntN(1100)) // around the documented 1,000 ops
		}
		orig := l.Len()
		for i := 0; i < n; i++ {
			l.Append(cloneValue(l.Get(i%orig), fd))
		}
	case op == 2 && l.Len() > 0:
		i := mu.r.IntN(l.Len())
		l.Set(i, mu.value(l.Get(i), fd, depth))
	case op == 3 && l.Len() > 1:
		i := mu.r.IntN(l.Len())
		last := l.Len() - 1
		l.Set(i, l.Get(last))
		l.Truncate(last)
	default:
		v := l.NewElement()
		l.Append(mu.value(v, fd, depth))
	}
}

// cloneValue copies a list element: a message element must not be shared
// by two positions (a later mutation of one would change both).
func cloneValue(v protoreflect.Value, fd protoreflect.FieldDescriptor) protoreflect.Value {
	if fd.Message() != nil {
		return protoreflect.ValueOfMessage(proto.Clone(v.Message().Interface()).ProtoReflect())
	}
	return v
}

// value returns a mutated v of fd's kind (a fresh or changed message for a
// message kind).
func (mu *Mutator) value(v protoreflect.Value, fd protoreflect.FieldDescriptor, depth int) protoreflect.Value {
	if fd.Message() != nil {
		msg := v.Message()
		for range 1 + mu.r.IntN(3) {
			mu.mutateOne(msg, depth+1)
		}
		return v
	}
	return mu.scalar(fd, v)
}

// scalar returns a new value of fd's scalar kind: an extreme, a live
// value, a neighbour of the old one, or a random one.
func (mu *Mutator) scalar(fd protoreflect.FieldDescriptor, old protoreflect.Value) protoreflect.Value {
	u := mu.integer(old)
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(!old.IsValid() || !old.Bool())
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		switch mu.r.IntN(4) {
		case 0:
			return protoreflect.ValueOfEnum(protoreflect.EnumNumber(int32(u)))
		case 1:
			return protoreflect.ValueOfEnum(protoreflect.EnumNumber(vals.Len() + mu.r.IntN(3)))
		default:
			return protoreflect.ValueOfEnum(vals.Get(mu.r.IntN(vals.Len())).Number())
		}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(u))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(u))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(u))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(u)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(mu.float()))
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(mu.float())
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(mu.str())
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes(mu.bytes())
	}
	return old
}

// integer is an extreme, a live number, a neighbour of old, or random.
func (mu *Mutator) integer(old protoreflect.Value) uint64 {
	var prev uint64
	if old.IsValid() {
		switch x := old.Interface().(type) {
		case int32:
			prev = uint64(x)
		case int64:
			prev = uint64(x)
		case uint32:
			prev = uint64(x)
		case uint64:
			prev = x
		}
	}
	switch mu.r.IntN(6) {
	case 0, 1:
		ex := extremes()
		return ex[mu.r.IntN(len(ex))]
	case 2:
		if len(mu.Numbers) > 0 {
			return mu.Numbers[mu.r.IntN(len(mu.Numbers))] + uint64(mu.r.IntN(3)) - 1
		}
	case 3:
		return prev + uint64(mu.r.IntN(5)) - 2
	case 4:
		return -uint64(mu.r.IntN(1000)) // a small negative number
	}
	return mu.r.Uint64() >> mu.r.IntN(64)
}

func (mu *Mutator) float() float64 {
	fs := []float64{0, math.Copysign(0, -1), math.NaN(), math.Inf(1), math.Inf(-1), math.MaxFloat64, math.SmallestNonzeroFloat64, -1}
	if mu.r.IntN(2) == 0 {
		return fs[mu.r.IntN(len(fs))]
	}
	return mu.r.NormFloat64() * 1e6
}

// str is a valid UTF-8 string (invalid ones go in on the wire, below):
// empty, huge, a live value, odd characters, or random.
func (mu *Mutator) str() string {
	switch mu.r.IntN(8) {
	case 0:
		return ""
	case 1:
		return strings.Repeat("k", mu.huge())
	case 2:
		if len(mu.Strings) > 0 {
			return mu.Strings[mu.r.IntN(len(mu.Strings))]
		}
	case 3:
		odd := []string{"\x00", "\x00walship/epoch", "..", "/", "%2e%2e", "\u202e", "\U0010FFFF", "\ufeff", strings.Repeat("é", 2049),
			"spiffe://walship.dev/walship/admin/x", "127.0.0.1:1", "[::1]:0", "replica-0", "primary"}
		return odd[mu.r.IntN(len(odd))]
	case 4:
		return strings.Repeat("x", 4095+mu.r.IntN(3)) // around the key limit
	}
	var b strings.Builder
	for range mu.r.IntN(32) {
		b.WriteRune(rune(mu.r.IntN(0x10FFFF)))
	}
	return strings.ToValidUTF8(b.String(), "?")
}

func (mu *Mutator) bytes() []byte {
	switch mu.r.IntN(5) {
	case 0:
		return nil
	case 1:
		return bytes.Repeat([]byte{0xA5}, mu.huge())
	case 2:
		return bytes.Repeat([]byte{'v'}, 1<<20+mu.r.IntN(3)-1) // around the value limit
	}
	b := make([]byte, mu.r.IntN(64))
	for i := range b {
		b[i] = byte(mu.r.Uint32())
	}
	return b
}

// huge is a size for a huge field: up to MaxBytes, and sometimes just past it.
func (mu *Mutator) huge() int {
	if mu.r.IntN(4) == 0 {
		return mu.MaxBytes + 1 + mu.r.IntN(4096)
	}
	return 1 + mu.r.IntN(max(mu.MaxBytes, 1))
}

// Wire applies one wire-format mutation to b, an encoding of a message of
// type md, and returns the result.
func (mu *Mutator) Wire(b []byte, md protoreflect.MessageDescriptor) []byte {
	switch mu.r.IntN(9) {
	case 0, 1, 7:
		if out, ok := mu.invalidUTF8(b, md); ok {
			return out
		}
		fallthrough
	case 2, 3:
		return mu.unknownField(b)
	case 4:
		// A known field number with the wrong wire type.
		fields := md.Fields()
		if fields.Len() == 0 {
			return mu.unknownField(b)
		}
		fd := fields.Get(mu.r.IntN(fields.Len()))
		switch mu.r.IntN(4) {
		case 0:
			return protowire.AppendVarint(protowire.AppendTag(b, fd.Number(), protowire.VarintType), mu.r.Uint64())
		case 1:
			return protowire.AppendFixed32(protowire.AppendTag(b, fd.Number(), protowire.Fixed32Type), mu.r.Uint32())
		case 2:
			return protowire.AppendFixed64(protowire.AppendTag(b, fd.Number(), protowire.Fixed64Type), mu.r.Uint64())
		}
		return protowire.AppendBytes(protowire.AppendTag(b, fd.Number(), protowire.BytesType), []byte{0x08})
	case 5:
		if len(b) > 0 {
			return b[:mu.r.IntN(len(b))] // truncated mid-field
		}
		return []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f} // a length past the end
	case 6:
		out := bytes.Clone(b)
		for range 1 + mu.r.IntN(4) {
			if len(out) > 0 {
				out[mu.r.IntN(len(out))] ^= byte(1 << mu.r.IntN(8))
			}
		}
		return out
	}
	return mu.Noise()
}

// Noise is random bytes as a whole message: empty, short, or huge.
func (mu *Mutator) Noise() []byte {
	n := mu.r.IntN(256)
	if mu.r.IntN(8) == 0 {
		n = mu.huge()
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(mu.r.Uint32())
	}
	return b
}

// unknownField appends a field the schema does not know: any number up to
// the largest, any wire type, a small or huge payload.
func (mu *Mutator) unknownField(b []byte) []byte {
	num := protowire.Number(1000 + mu.r.IntN(100000))
	if mu.r.IntN(4) == 0 {
		num = protowire.MaxValidNumber
	}
	switch mu.r.IntN(4) {
	case 0:
		return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), mu.r.Uint64())
	case 1:
		return protowire.AppendFixed64(protowire.AppendTag(b, num, protowire.Fixed64Type), mu.r.Uint64())
	case 2:
		// A group: proto3 has none, the parser must still skip it.
		b = protowire.AppendTag(b, num, protowire.StartGroupType)
		b = protowire.AppendVarint(protowire.AppendTag(b, 1, protowire.VarintType), 1)
		return protowire.AppendTag(b, num, protowire.EndGroupType)
	}
	n := mu.r.IntN(64)
	if mu.r.IntN(3) == 0 {
		n = mu.huge()
	}
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), bytes.Repeat([]byte{0x5a}, n))
}

// invalidUTF8 appends to b a string field holding invalid UTF-8, at a
// random string field of md or of a message below it (appended, a
// singular message field merges into the one b already has; a repeated
// one gains an element). Often a huge unknown field comes first: the
// decoder keeps what it parsed before the bad string, so a server that
// keeps a refused request keeps all of it.
func (mu *Mutator) invalidUTF8(b []byte, md protoreflect.MessageDescriptor) ([]byte, bool) {
	path := mu.stringPath(md, 0)
	if path == nil {
		return b, false
	}
	bad := []byte("\xff\xfe\xc0\x80")
	if mu.r.IntN(4) == 0 {
		bad = append(bytes.Repeat([]byte{'k'}, mu.r.IntN(4096)), 0xff)
	}
	// Build from the innermost field outwards.
	inner := protowire.AppendBytes(protowire.AppendTag(nil, path[len(path)-1].Number(), protowire.BytesType), bad)
	for i := len(path) - 2; i >= 0; i-- {
		inner = protowire.AppendBytes(protowire.AppendTag(nil, path[i].Number(), protowire.BytesType), inner)
	}
	var out []byte
	if mu.r.IntN(3) > 0 {
		pad := mu.huge() - len(b) - len(inner)
		out = protowire.AppendBytes(protowire.AppendTag(nil, 1000+protowire.Number(mu.r.IntN(1000)), protowire.BytesType), bytes.Repeat([]byte{0x5a}, max(pad, 1)))
	}
	out = append(out, b...)
	return append(out, inner...), true
}

// stringPath is a random path of message fields ending at a string
// field, or nil if md has none within a few levels.
func (mu *Mutator) stringPath(md protoreflect.MessageDescriptor, depth int) []protoreflect.FieldDescriptor {
	if depth > 4 {
		return nil
	}
	fields := md.Fields()
	start := mu.r.IntN(fields.Len() + 1)
	for i := range fields.Len() {
		fd := fields.Get((start + i) % fields.Len())
		switch {
		case fd.IsMap():
			continue
		case fd.Kind() == protoreflect.StringKind:
			return []protoreflect.FieldDescriptor{fd}
		case fd.Message() != nil:
			if sub := mu.stringPath(fd.Message(), depth+1); sub != nil {
				return append([]protoreflect.FieldDescriptor{fd}, sub...)
			}
		}
	}
	return nil
}
