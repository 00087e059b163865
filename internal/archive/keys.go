package archive

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// Client-side encryption (docs/FORMAT.md, *Archive encryption*): the
// object store holds only ciphertext, so whoever runs it cannot read the
// log (pgBackRest's and WAL-G's repository encryption). AES-256-GCM in
// segments of segmentBytes of plaintext, so that an object of any size
// is encrypted and checked in bounded memory; each object gets its own
// key, derived with HKDF-SHA256 from the master key, a random salt and the
// object's name, so the segment nonces can be counters and an object
// cannot be passed off under another name. The last segment is marked in
// its nonce, so a truncated object fails to decrypt rather than reading
// as a shorter one (the streaming AEAD of Tink and age).

// Keyring is the master keys of an archive, read from a key file: one
// "ID BASE64-KEY" line per key (32 bytes, e.g. `openssl rand -base64
// 32`), '#' comments and blank lines ignored. The last key encrypts new
// objects; every key decrypts, so keys rotate by appending a new line
// (and old objects stay readable while their key is in the file).
type Keyring struct {
	keys    map[string][]byte
	current string
}

var keyIDRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// LoadKeyring reads a key file.
func LoadKeyring(path string) (*Keyring, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--archive-key-file: %w", err)
	}
	k, err := ParseKeyring(b)
	if err != nil {
		return nil, fmt.Errorf("--archive-key-file %s: %w", path, err)
	}
	return k, nil
}

// ParseKeyring parses the contents of a key file.
func ParseKeyring(b []byte) (*Keyring, error) {
	k := &Keyring{keys: map[string][]byte{}}
	sc := bufio.NewScanner(bytes.NewReader(b))
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		f := strings.Fields(s)
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want \"ID BASE64-KEY\"", line)
		}
		if !keyIDRe.MatchString(f[0]) {
			return nil, fmt.Errorf("line %d: key id %q: want 1 to 64 of A-Z a-z 0-9 . _ -", line, f[0])
		}
		key, err := base64.StdEncoding.DecodeString(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: key %s: %v", line, f[0], err)
		}
		if len(key) != 32 {
			return nil, fmt.Errorf("line %d: key %s is %d bytes, want 32 (AES-256)", line, f[0], len(key))
		}
		if _, dup := k.keys[f[0]]; dup {
			return nil, fmt.Errorf("line %d: key id %s appears twice", line, f[0])
		}
		k.keys[f[0]] = key
		k.current = f[0]
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if k.current == "" {
		return nil, errors.New("no key")
	}
	return k, nil
}

// Current is the id of the key new objects are encrypted with.
func (k *Keyring) Current() string { return k.current }

// Encryption format constants.
const (
	encMagic     = "WSHPENC1"
	saltBytes    = 32
	segmentBytes = 1 << 20
	tagBytes     = 16
)

// objectAEAD derives the AEAD of one object.
func objectAEAD(master, salt []byte, name string) (cipher.AEAD, error) {
	key, err := hkdf.Key(sha256.New, master, salt, "walship archive v1 "+name, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func segmentNonce(i uint64, last bool) []byte {
	n := make([]byte, 12)
	binary.BigEndian.PutUint64(n[3:11], i)
	if last {
		n[11] = 1
	}
	return n
}

// Seal encrypts plain as the object name with the current key and
// returns the stored bytes.
func (k *Keyring) Seal(name string, plain []byte) ([]byte, error) {
	var out bytes.Buffer
	out.Grow(len(encMagic) + 1 + len(k.current) + saltBytes + len(plain) + (len(plain)/segmentBytes+1)*tagBytes)
	if _, err := k.SealStream(name, bytes.NewReader(plain), &out); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// SealStream encrypts what r holds as the object name with the current
// key, writing the stored bytes to w one segment at a time; it returns
// how many it wrote.
func (k *Keyring) SealStream(name string, r io.Reader, w io.Writer) (int64, error) {
	salt := make([]byte, saltBytes)
	if _, err := rand.Read(salt); err != nil {
		return 0, err
	}
	aead, err := objectAEAD(k.keys[k.current], salt, name)
	if err != nil {
		return 0, err
	}
	hdr := append([]byte(encMagic), byte(len(k.current)))
	hdr = append(append(hdr, k.current...), salt...)
	n, err := w.Write(hdr)
	written := int64(n)
	if err != nil {
		return written, err
	}
	// One segment is read ahead, so that the last one is known as such.
	cur, next := make([]byte, segmentBytes), make([]byte, segmentBytes)
	out := make([]byte, 0, segmentBytes+tagBytes)
	cn, err := io.ReadFull(r, cur)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return written, err
	}
	for i := uint64(0); ; i++ {
		nn := 0
		if cn == segmentBytes {
			nn, err = io.ReadFull(r, next)
			if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				return written, err
			}
		}
		last := nn == 0
		out = aead.Seal(out[:0], segmentNonce(i, last), cur[:cn], nil)
		n, err := w.Write(out)
		written += int64(n)
		if err != nil {
			return written, err
		}
		if last {
			return written, nil
		}
		cur, next, cn = next, cur, nn
	}
}

// KeyID returns the id of the key an encrypted object's bytes name (its
// header), or "" if they are not encrypted.
func KeyID(stored []byte) string {
	if len(stored) < len(encMagic)+1 || string(stored[:len(encMagic)]) != encMagic {
		return ""
	}
	n := int(stored[len(encMagic)])
	if len(stored) < len(encMagic)+1+n {
		return ""
	}
	return string(stored[len(encMagic)+1 : len(encMagic)+1+n])
}

// openReader decrypts the stored bytes of object name read from r
// (storedSize bytes in all) as they are read.
func (k *Keyring) openReader(name string, r io.Reader, storedSize int64) (io.Reader, error) {
	hdr := make([]byte, len(encMagic)+1)
	if _, err := io.ReadFull(r, hdr); err != nil || string(hdr[:len(encMagic)]) != encMagic {
		return nil, fmt.Errorf("not an encrypted object (no %s header)", encMagic)
	}
	idLen := int(hdr[len(encMagic)])
	rest := make([]byte, idLen+saltBytes)
	if _, err := io.ReadFull(r, rest); err != nil {
		return nil, fmt.Errorf("encryption header: %w", err)
	}
	id := string(rest[:idLen])
	master, ok := k.keys[id]
	if !ok {
		return nil, &KeyError{ID: id}
	}
	aead, err := objectAEAD(master, rest[idLen:], name)
	if err != nil {
		return nil, err
	}
	body := storedSize - int64(len(hdr)+len(rest))
	if body < tagBytes {
		return nil, fmt.Errorf("encrypted object of %d bytes is too short", storedSize)
	}
	return &openingReader{aead: aead, r: r, left: body}, nil
}

// KeyError is an object encrypted with a key the key file does not hold.
type KeyError struct{ ID string }

func (e *KeyError) Error() string {
	return fmt.Sprintf("encrypted with key %q, which the key file does not hold (add it back to --archive-key-file)", e.ID)
}

// openingReader decrypts one segment at a time.
type openingReader struct {
	aead cipher.AEAD
	r    io.Reader
	left int64 // stored bytes not yet read
	i    uint64
	buf  []byte // decrypted, not yet returned
	seg  []byte
	done bool
}

func (o *openingReader) Read(p []byte) (int, error) {
	for len(o.buf) == 0 {
		if o.done {
			return 0, io.EOF
		}
		n := min(o.left, int64(segmentBytes+tagBytes))
		last := o.left == n
		if cap(o.seg) < int(n) {
			o.seg = make([]byte, n)
		}
		seg := o.seg[:n]
		if _, err := io.ReadFull(o.r, seg); err != nil {
			return 0, fmt.Errorf("encrypted segment %d: %w", o.i, err)
		}
		o.left -= n
		plain, err := o.aead.Open(seg[:0], segmentNonce(o.i, last), seg, nil)
		if err != nil {
			return 0, fmt.Errorf("encrypted segment %d does not authenticate (damaged, truncated, or not this object's)", o.i)
		}
		o.buf = plain
		o.i++
		o.done = last
	}
	n := copy(p, o.buf)
	o.buf = o.buf[n:]
	return n, nil
}
