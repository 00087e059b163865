package codec

import "hash/crc32"

// castagnoli is the CRC32C table. It is built once and only read afterwards;
// crc32 uses the SSE4.2/ARMv8 instructions for this polynomial when present.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC32C (Castagnoli) checksum of p, the checksum walship
// uses for batch envelopes and WAL segments.
func Checksum(p []byte) uint32 { return crc32.Checksum(p, castagnoli) }

// UpdateChecksum returns crc extended with p, so a checksum can be computed
// over data that is not contiguous: UpdateChecksum(Checksum(a), b) equals
// Checksum(append(a, b...)).
func UpdateChecksum(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }
