package archive

import (
	"encoding/binary"
	"errors"
	"fmt"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/pkg/codec"
)

// A WAL chunk is the plaintext of one wal/ object: whole batches of one
// epoch, consecutive, each the envelope bytes the primary wrote (the same
// bytes every log store and replica holds).
//
//	header (48 bytes, little-endian)
//	  0  8  magic      "WSHPARCW"
//	  8  4  version    1
//	 12  4  batches    number of frames that follow
//	 16  8  epoch      every batch's epoch
//	 24  8  first_lsn  the first batch's first LSN
//	 32  8  last_lsn   the last batch's last LSN
//	 40  4  reserved   0
//	 44  4  crc        CRC-32C of bytes 0..43
//	frames, `batches` times
//	  0  4  length     n, at most MaxBatchBytes
//	  4  n  envelope   a walship.v1.WalBatch as stored
//
// Nothing follows the last frame.
const (
	chunkMagic      = "WSHPARCW"
	chunkVersion    = 1
	chunkHeaderSize = 48
	// MaxBatchBytes bounds one envelope in a chunk (a WAL entry's limit).
	MaxBatchBytes = 256 << 20
)

// Chunk describes a WAL chunk: its batches' epoch and LSN range.
type Chunk struct {
	Epoch, FirstLSN, LastLSN uint64
	Batches                  int
	// LastCommit is the commit time of its last batch (Unix ns).
	LastCommit int64
}

// ChunkBuilder gathers envelopes into one chunk's bytes.
type ChunkBuilder struct {
	c    Chunk
	data []byte
}

// Len is how many bytes the chunk holds so far.
func (b *ChunkBuilder) Len() int { return len(b.data) }

// Chunk is what the chunk holds so far.
func (b *ChunkBuilder) Chunk() Chunk { return b.c }

// Add appends one stored envelope (the bytes, and env decoded from them).
// It must continue the chunk: the same epoch, the next LSN.
func (b *ChunkBuilder) Add(data []byte, env *walshipv1.WalBatch) error {
	switch {
	case len(data) > MaxBatchBytes:
		return fmt.Errorf("batch %d..%d is %d bytes, more than %d", env.GetFirstLsn(), env.GetLastLsn(), len(data), MaxBatchBytes)
	case b.c.Batches > 0 && env.GetEpoch() != b.c.Epoch:
		return fmt.Errorf("batch %d..%d of epoch %d after batches of epoch %d", env.GetFirstLsn(), env.GetLastLsn(), env.GetEpoch(), b.c.Epoch)
	case b.c.Batches > 0 && env.GetFirstLsn() != b.c.LastLSN+1:
		return fmt.Errorf("batch %d..%d after LSN %d", env.GetFirstLsn(), env.GetLastLsn(), b.c.LastLSN)
	}
	if b.c.Batches == 0 {
		b.data = append(b.data[:0], make([]byte, chunkHeaderSize)...)
		b.c = Chunk{Epoch: env.GetEpoch(), FirstLSN: env.GetFirstLsn()}
	}
	b.data = binary.LittleEndian.AppendUint32(b.data, uint32(len(data)))
	b.data = append(b.data, data...)
	b.c.LastLSN, b.c.LastCommit = env.GetLastLsn(), env.GetCommitTimeUnixNano()
	b.c.Batches++
	return nil
}

// Finish returns the chunk's bytes, which the caller now owns (the
// builder starts a new buffer), and resets the builder.
func (b *ChunkBuilder) Finish() ([]byte, Chunk) {
	h := b.data[:chunkHeaderSize]
	copy(h, chunkMagic)
	binary.LittleEndian.PutUint32(h[8:], chunkVersion)
	binary.LittleEndian.PutUint32(h[12:], uint32(b.c.Batches))
	binary.LittleEndian.PutUint64(h[16:], b.c.Epoch)
	binary.LittleEndian.PutUint64(h[24:], b.c.FirstLSN)
	binary.LittleEndian.PutUint64(h[32:], b.c.LastLSN)
	binary.LittleEndian.PutUint32(h[40:], 0)
	binary.LittleEndian.PutUint32(h[44:], codec.Checksum(h[:44]))
	data, c := b.data, b.c
	b.data, b.c = nil, Chunk{}
	return data, c
}

// ErrBadChunk is wrapped by every error DecodeChunk returns.
var ErrBadChunk = errors.New("bad WAL chunk")

// DecodeChunk checks a chunk's bytes and calls fn with each batch in
// order: its header, every frame's length, and every envelope (CRC, LSNs,
// epoch, continuity) are checked before fn sees it; the envelope's
// payload is not decoded. fn's error stops the walk and is returned;
// fn may be nil.
func DecodeChunk(data []byte, fn func(env *walshipv1.WalBatch) error) (Chunk, error) {
	bad := func(format string, a ...any) (Chunk, error) {
		return Chunk{}, fmt.Errorf("%w: %s", ErrBadChunk, fmt.Sprintf(format, a...))
	}
	if len(data) < chunkHeaderSize {
		return bad("%d bytes, shorter than its header", len(data))
	}
	h := data[:chunkHeaderSize]
	switch {
	case string(h[:8]) != chunkMagic:
		return bad("magic %q", h[:8])
	case binary.LittleEndian.Uint32(h[44:]) != codec.Checksum(h[:44]):
		return bad("header CRC")
	case binary.LittleEndian.Uint32(h[8:]) != chunkVersion:
		return bad("version %d", binary.LittleEndian.Uint32(h[8:]))
	case binary.LittleEndian.Uint32(h[40:]) != 0:
		return bad("reserved bytes set")
	}
	c := Chunk{
		Batches:  int(binary.LittleEndian.Uint32(h[12:])),
		Epoch:    binary.LittleEndian.Uint64(h[16:]),
		FirstLSN: binary.LittleEndian.Uint64(h[24:]),
		LastLSN:  binary.LittleEndian.Uint64(h[32:]),
	}
	if c.Batches == 0 || c.FirstLSN == 0 || c.LastLSN < c.FirstLSN {
		return bad("header says %d batches, LSNs %d..%d", c.Batches, c.FirstLSN, c.LastLSN)
	}
	rest := data[chunkHeaderSize:]
	next := c.FirstLSN
	for i := 0; i < c.Batches; i++ {
		if len(rest) < 4 {
			return bad("frame %d: truncated length", i)
		}
		n := binary.LittleEndian.Uint32(rest)
		rest = rest[4:]
		if n > MaxBatchBytes || int64(n) > int64(len(rest)) {
			return bad("frame %d: length %d does not fit the %d bytes left", i, n, len(rest))
		}
		var env walshipv1.WalBatch
		if err := envelope.Unmarshal(rest[:n], &env); err != nil {
			return bad("frame %d: %v", i, err)
		}
		rest = rest[n:]
		if err := envelope.Verify(&env); err != nil {
			return bad("batch %d..%d: %v", env.GetFirstLsn(), env.GetLastLsn(), err)
		}
		switch {
		case env.GetEpoch() != c.Epoch:
			return bad("batch %d..%d is of epoch %d, the chunk's is %d", env.GetFirstLsn(), env.GetLastLsn(), env.GetEpoch(), c.Epoch)
		case env.GetFirstLsn() != next:
			return bad("batch %d..%d where LSN %d was next", env.GetFirstLsn(), env.GetLastLsn(), next)
		case env.GetLastLsn() > c.LastLSN:
			return bad("batch %d..%d ends past the chunk's last LSN %d", env.GetFirstLsn(), env.GetLastLsn(), c.LastLSN)
		}
		next = env.GetLastLsn() + 1
		c.LastCommit = env.GetCommitTimeUnixNano()
		if fn != nil {
			if err := fn(&env); err != nil {
				return c, err
			}
		}
	}
	switch {
	case len(rest) != 0:
		return bad("%d bytes after the last frame", len(rest))
	case next != c.LastLSN+1:
		return bad("the batches end at LSN %d, the header says %d", next-1, c.LastLSN)
	}
	return c, nil
}
