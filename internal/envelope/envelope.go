// Package envelope builds and checks WalBatch envelopes, the unit every
// walship process stores and ships. The primary marshals an envelope once
// (deterministically); its WAL, every log store and every replica keep those
// bytes, and every receiver verifies them with Verify before use.
package envelope

import (
	"fmt"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/protobuf/proto"
)

// ErrChecksum is wrapped by Verify's error when the payload does not match
// its CRC; it wraps codec.ErrCorrupt.
var ErrChecksum = fmt.Errorf("%w: payload crc32c mismatch", codec.ErrCorrupt)

// Marshal returns the deterministic encoding of env: the bytes stored in a
// WAL entry.
func Marshal(env *walshipv1.WalBatch) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(env)
}

// Unmarshal parses stored envelope bytes into env.
func Unmarshal(data []byte, env *walshipv1.WalBatch) error {
	if err := proto.Unmarshal(data, env); err != nil {
		return fmt.Errorf("%w: unmarshal envelope: %v", codec.ErrCorrupt, err)
	}
	return nil
}

// Verify checks what can be checked without decoding the payload: a known
// codec, an LSN range (first <= last, prev = first-1) and the payload's
// CRC-32C. Errors wrap codec.ErrCorrupt.
func Verify(env *walshipv1.WalBatch) error {
	if env == nil {
		return fmt.Errorf("%w: no batch", codec.ErrCorrupt)
	}
	if env.FirstLsn == 0 || env.LastLsn < env.FirstLsn {
		return fmt.Errorf("%w: LSN range %d..%d is empty or starts at 0", codec.ErrCorrupt, env.FirstLsn, env.LastLsn)
	}
	if env.PrevLsn != env.FirstLsn-1 {
		return fmt.Errorf("%w: prev_lsn %d but first_lsn %d", codec.ErrCorrupt, env.PrevLsn, env.FirstLsn)
	}
	if _, err := codec.ByID(codec.ID(env.Codec)); err != nil {
		return fmt.Errorf("%w: codec %v: %v", codec.ErrCorrupt, env.Codec, err)
	}
	if got := codec.Checksum(env.Payload); got != env.Crc32C {
		return fmt.Errorf("%w: LSNs %d..%d: payload crc32c %08x, envelope says %08x", ErrChecksum, env.FirstLsn, env.LastLsn, got, env.Crc32C)
	}
	return nil
}

// Decode verifies env and decodes its payload into b; b's records alias
// env.Payload. It also checks the payload holds exactly the envelope's LSNs.
func Decode(env *walshipv1.WalBatch, b *codec.Batch) error {
	if err := Verify(env); err != nil {
		return err
	}
	return DecodePayload(env, b)
}

// DecodePayload is Decode for an envelope Verify already accepted, so a
// receiver that verifies first does not checksum the payload twice.
func DecodePayload(env *walshipv1.WalBatch, b *codec.Batch) error {
	c, err := codec.ByID(codec.ID(env.Codec))
	if err != nil {
		return fmt.Errorf("%w: codec %v: %v", codec.ErrCorrupt, env.Codec, err)
	}
	if err := c.DecodeBatch(env.Payload, b); err != nil {
		return fmt.Errorf("LSNs %d..%d: %w", env.FirstLsn, env.LastLsn, err)
	}
	if b.FirstLSN() != env.FirstLsn || b.LastLSN() != env.LastLsn {
		return fmt.Errorf("%w: payload holds LSNs %d..%d, envelope says %d..%d", codec.ErrCorrupt, b.FirstLSN(), b.LastLSN(), env.FirstLsn, env.LastLsn)
	}
	if r := b.Records[len(b.Records)-1]; r.Op != codec.OpCommit {
		return fmt.Errorf("%w: batch %d..%d does not end with a commit", codec.ErrCorrupt, env.FirstLsn, env.LastLsn)
	}
	return nil
}

// DecodeStored unmarshals stored bytes and decodes them (Unmarshal + Decode).
func DecodeStored(data []byte, env *walshipv1.WalBatch, b *codec.Batch) error {
	if err := Unmarshal(data, env); err != nil {
		return err
	}
	return Decode(env, b)
}
