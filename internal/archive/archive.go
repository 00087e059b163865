// Package archive keeps walship's history in an object store, so that it
// outlives the cluster: WAL chunks (whole batches, as the primary wrote
// them), base snapshots and the epoch history, in an S3-compatible bucket
// (or a local directory), each object checked by a SHA-256 in its
// metadata on every download and optionally encrypted on the client
// (AES-256-GCM). The layout is in layout.go and docs/FORMAT.md (*Archive*);
// who uploads what, and why nothing a failover cuts is ever restored as
// committed, in docs/ARCHITECTURE.md (*Archive*).
//
// The package knows objects, not services: the log store's uploader
// (services/logstore/archive.go) writes through it, and walship restore
// and ctl verify read through it.
package archive

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
)

// Config says where the archive is and how to reach it.
type Config struct {
	// URL is s3://BUCKET/PREFIX or file:///DIRECTORY.
	URL string
	// Endpoint is the S3 endpoint (https://host:port) of a service other
	// than AWS; empty uses AWS's for Region.
	Endpoint string
	// Region signs requests (us-east-1 when neither it nor the SDK's
	// configuration says).
	Region string
	// PathStyle addresses the bucket in the path (most S3-compatible
	// servers) rather than the host name.
	PathStyle bool
	// CAFile is a PEM bundle of CAs to trust for Endpoint (besides the
	// system's).
	CAFile string
	// KeyFile holds the encryption keys (Keyring); empty stores plaintext.
	KeyFile string
	// Timeout bounds each request to an S3 store: its answer, an
	// upload's body (plus a second per MiB of it), a download's next
	// bytes. A store that stops answering fails the request after it
	// rather than holding the uploader or a restore. 0: DefaultTimeout.
	Timeout time.Duration
}

// Set reports whether an archive is configured.
func (c Config) Set() bool { return c.URL != "" }

// Validate checks the settings without reaching the store.
func (c Config) Validate() error {
	if c.URL == "" {
		if c.Endpoint != "" || c.Region != "" || c.PathStyle || c.CAFile != "" || c.KeyFile != "" {
			return errors.New("--archive: required with the other --archive-* flags")
		}
		return nil
	}
	scheme, _, _, err := parseURL(c.URL)
	if err != nil {
		return err
	}
	if c.Timeout < 0 {
		return fmt.Errorf("--archive-timeout: %v is negative", c.Timeout)
	}
	if scheme == "file" && (c.Endpoint != "" || c.Region != "" || c.PathStyle || c.CAFile != "") {
		return errors.New("--archive: a file:// archive takes no endpoint, region, path style or CA file")
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--archive-endpoint: %q is not an http(s)://host[:port] URL", c.Endpoint)
		}
	}
	return nil
}

// parseURL splits an archive URL into its scheme, bucket (or directory)
// and prefix (empty, or ending in '/').
func parseURL(raw string) (scheme, bucket, prefix string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", "", fmt.Errorf("--archive: %v", err)
	}
	switch u.Scheme {
	case "s3":
		if u.Host == "" {
			return "", "", "", fmt.Errorf("--archive: %q names no bucket (s3://BUCKET/PREFIX)", raw)
		}
		if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Port() != "" {
			return "", "", "", fmt.Errorf("--archive: %q: want s3://BUCKET/PREFIX (the endpoint goes in --archive-endpoint)", raw)
		}
		prefix = strings.Trim(u.Path, "/")
		if prefix != "" {
			prefix += "/"
		}
		return "s3", u.Host, prefix, nil
	case "file":
		if u.Host != "" || u.Path == "" || u.RawQuery != "" || u.Fragment != "" {
			return "", "", "", fmt.Errorf("--archive: %q: want file:///ABSOLUTE/DIRECTORY", raw)
		}
		return "file", u.Path, "", nil
	}
	return "", "", "", fmt.Errorf("--archive: %q: want s3://BUCKET/PREFIX or file:///DIRECTORY", raw)
}

// Archive is an opened archive.
type Archive struct {
	bucket Bucket
	keys   *Keyring // nil: plaintext
	logger *slog.Logger
}

// Open opens the archive c names. It does not reach the store: a wrong
// address or credentials show at the first request, with the server's
// answer.
func Open(ctx context.Context, c Config, logger *slog.Logger) (*Archive, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if !c.Set() {
		return nil, errors.New("--archive: not set")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	a := &Archive{logger: logger}
	if c.KeyFile != "" {
		k, err := LoadKeyring(c.KeyFile)
		if err != nil {
			return nil, err
		}
		a.keys = k
	}
	scheme, bucket, prefix, err := parseURL(c.URL)
	if err != nil {
		return nil, err
	}
	switch scheme {
	case "s3":
		a.bucket, err = newS3Bucket(ctx, c, bucket, prefix)
	default:
		a.bucket, err = newFileBucket(bucket)
	}
	if err != nil {
		return nil, err
	}
	return a, nil
}

// New is an archive in bucket b (tests: any Bucket).
func New(b Bucket, keys *Keyring, logger *slog.Logger) *Archive {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Archive{bucket: b, keys: keys, logger: logger}
}

// Bucket is the store the archive lives in.
func (a *Archive) Bucket() Bucket { return a.bucket }

// String names the archive (its URL).
func (a *Archive) String() string { return a.bucket.String() }

// Encrypted reports whether new objects are encrypted.
func (a *Archive) Encrypted() bool { return a.keys != nil }

// Metadata keys every object carries (x-amz-meta-… on S3).
const (
	metaFormat  = "walship-format"
	metaCluster = "walship-cluster"
	metaSHA256  = "walship-sha256"
	metaKeyID   = "walship-key-id"
	metaPlain   = "walship-plain-bytes"
	// formatVersion is the archive layout's version.
	formatVersion = "1"
)

// CorruptError is an object whose bytes are not what was stored: a
// checksum that does not match, a truncated or undecodable object, one of
// another cluster. It names the object and, for WAL chunks and snapshots,
// the LSNs it holds. gRPC edges map it to DATA_LOSS.
type CorruptError struct {
	Name    string
	LSNs    string // "LSNs 1..200" or "LSN 300", if known
	Problem string
}

func (e *CorruptError) Error() string {
	s := "archive object " + e.Name
	if e.LSNs != "" {
		s += " (" + e.LSNs + ")"
	}
	return s + ": " + e.Problem
}

func lsnsOf(name string) string {
	if c, ok := parseChunkName(name); ok {
		return fmt.Sprintf("LSNs %d..%d of epoch %d", c.FirstLSN, c.LastLSN, c.Epoch)
	}
	if s, ok := parseSnapshotName(name); ok {
		return fmt.Sprintf("snapshot at LSN %d", s.LSN)
	}
	return ""
}

func corrupt(name, format string, a ...any) error {
	return &CorruptError{Name: name, LSNs: lsnsOf(name), Problem: fmt.Sprintf(format, a...)}
}

// put stores plain as name: encrypted if the archive has keys, with its
// checksum and cluster in the metadata.
func (a *Archive) put(ctx context.Context, name, cluster string, plain []byte, extra map[string]string) error {
	stored := plain
	meta := map[string]string{metaFormat: formatVersion, metaCluster: cluster, metaPlain: strconv.Itoa(len(plain))}
	if a.keys != nil {
		var err error
		if stored, err = a.keys.Seal(name, plain); err != nil {
			return err
		}
		meta[metaKeyID] = a.keys.Current()
	}
	sum := sha256.Sum256(stored)
	meta[metaSHA256] = hex.EncodeToString(sum[:])
	for k, v := range extra {
		meta[k] = v
	}
	return a.bucket.Put(withPayloadSHA256(ctx, meta[metaSHA256]), name, bytes.NewReader(stored), int64(len(stored)), meta)
}

// get reads name whole, checks its size and checksum against its
// metadata (and its cluster, if cluster is set), and returns the
// plaintext. Objects are read whole only when they are bounded (chunks,
// histories, the cluster marker); snapshots stream (Download).
func (a *Archive) get(ctx context.Context, name, cluster string, limit int64) ([]byte, Info, error) {
	rc, info, err := a.bucket.Get(ctx, name)
	if err != nil {
		return nil, Info{}, err
	}
	defer rc.Close()
	if info.Size > limit {
		return nil, Info{}, corrupt(name, "%d bytes, more than the %d such an object may hold", info.Size, limit)
	}
	stored, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, Info{}, fmt.Errorf("%s: read %s: %w", a.bucket, name, err)
	}
	if err := checkStored(name, info, cluster, int64(len(stored)), sha256Of(stored)); err != nil {
		return nil, Info{}, err
	}
	plain, err := a.open(name, info, bytes.NewReader(stored), int64(len(stored)))
	if err != nil {
		return nil, Info{}, err
	}
	b, err := io.ReadAll(plain)
	if err != nil {
		return nil, Info{}, corrupt(name, "%v", err)
	}
	if want := info.Meta[metaPlain]; want != "" && want != strconv.Itoa(len(b)) {
		return nil, Info{}, corrupt(name, "%d bytes of plaintext, its metadata says %s", len(b), want)
	}
	return b, info, nil
}

func sha256Of(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// checkStored compares what was read of an object with its metadata.
func checkStored(name string, info Info, cluster string, size int64, sum string) error {
	switch {
	case info.Meta[metaFormat] != formatVersion:
		return corrupt(name, "format %q in its metadata, want %s (not an object walship wrote, or a newer walship's)", info.Meta[metaFormat], formatVersion)
	case info.Meta[metaSHA256] == "":
		return corrupt(name, "no checksum in its metadata")
	case size != info.Size:
		return corrupt(name, "read %d bytes, the store says %d", size, info.Size)
	case sum != info.Meta[metaSHA256]:
		return corrupt(name, "SHA-256 %s, its metadata says %s", sum, info.Meta[metaSHA256])
	case cluster != "" && info.Meta[metaCluster] != cluster:
		return corrupt(name, "of cluster %q, this archive is cluster %s's", info.Meta[metaCluster], cluster)
	}
	return nil
}

// open returns the plaintext of stored bytes read from r.
func (a *Archive) open(name string, info Info, r io.Reader, size int64) (io.Reader, error) {
	id := info.Meta[metaKeyID]
	if id == "" {
		return r, nil
	}
	if a.keys == nil {
		return nil, fmt.Errorf("archive object %s is encrypted (key %q): give --archive-key-file", name, id)
	}
	pr, err := a.keys.openReader(name, r, size)
	if err != nil {
		var ke *KeyError
		if errors.As(err, &ke) {
			return nil, fmt.Errorf("archive object %s: %w", name, err)
		}
		return nil, corrupt(name, "%v", err)
	}
	return pr, nil
}

// Limits of what one object holds.
const (
	// MaxChunkBytes bounds a WAL chunk object; the uploader cuts chunks
	// far below it (ChunkTarget), a batch larger than the target gets a
	// chunk of its own.
	MaxChunkBytes = MaxBatchBytes + 64<<20
	maxSmallBytes = 16 << 20 // the cluster marker, a history
)

// --- the cluster marker -----------------------------------------------

type clusterMarker struct {
	ClusterID string    `json:"cluster_id"`
	Format    int       `json:"format"`
	Created   time.Time `json:"created"`
}

// ClusterMismatchError is an archive that belongs to another cluster.
type ClusterMismatchError struct {
	Archive, Ours, Theirs string
}

func (e *ClusterMismatchError) Error() string {
	return fmt.Sprintf("the archive %s belongs to cluster %s, this is cluster %s: refusing to mix two clusters' histories (give each cluster its own --archive prefix)",
		e.Archive, e.Theirs, e.Ours)
}

// ClusterID returns the cluster the archive belongs to ("" when it holds
// no cluster marker yet: an empty archive).
func (a *Archive) ClusterID(ctx context.Context) (string, error) {
	b, _, err := a.get(ctx, clusterName, "", maxSmallBytes)
	if errors.Is(err, ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var m clusterMarker
	if err := json.Unmarshal(b, &m); err != nil || m.ClusterID == "" {
		// Quoted and cut short: the object is anyone's bytes, up to
		// maxSmallBytes of them.
		return "", corrupt(clusterName, "not a cluster marker: %d bytes, beginning %q", len(b), b[:min(len(b), 80)])
	}
	if err := datadir.ValidateClusterID(m.ClusterID); err != nil {
		return "", corrupt(clusterName, "cluster_id: %v", err)
	}
	return m.ClusterID, nil
}

// Claim makes the archive cluster's, or checks that it is: an archive
// of another cluster is refused (ClusterMismatchError), never written to.
func (a *Archive) Claim(ctx context.Context, cluster string) error {
	if err := datadir.ValidateClusterID(cluster); err != nil || cluster == "" {
		return fmt.Errorf("archive: cluster id %q: a cluster claims an archive only once it has an id", cluster)
	}
	have, err := a.ClusterID(ctx)
	if err != nil {
		return err
	}
	if have == "" {
		b, _ := json.Marshal(clusterMarker{ClusterID: cluster, Format: 1, Created: time.Now().UTC()})
		if err := a.put(ctx, clusterName, cluster, b, nil); err != nil {
			return err
		}
		// Two clusters starting on one empty prefix at once both write
		// the marker; the last one wins, and the other sees it here.
		if have, err = a.ClusterID(ctx); err != nil {
			return err
		}
	}
	if have != cluster {
		return &ClusterMismatchError{Archive: a.String(), Ours: cluster, Theirs: have}
	}
	return nil
}

// --- WAL chunks ---------------------------------------------------------

// PutChunk uploads a chunk's bytes (ChunkBuilder.Finish).
func (a *Archive) PutChunk(ctx context.Context, cluster string, data []byte, c Chunk) error {
	return a.put(ctx, ChunkName(c), cluster, data, nil)
}

// GetChunk downloads chunk c, checks it whole — its checksum, every
// frame and envelope (DecodeChunk), and that it holds what its name says
// — and returns its batches in order. Anything wrong is a CorruptError.
func (a *Archive) GetChunk(ctx context.Context, cluster string, c Chunk) ([]*walshipv1.WalBatch, error) {
	name := ChunkName(c)
	data, _, err := a.get(ctx, name, cluster, MaxChunkBytes)
	if err != nil {
		return nil, err
	}
	envs := make([]*walshipv1.WalBatch, 0, 16)
	got, err := DecodeChunk(data, func(env *walshipv1.WalBatch) error {
		envs = append(envs, env)
		return nil
	})
	if err != nil {
		return nil, corrupt(name, "%v", err)
	}
	if got.Epoch != c.Epoch || got.FirstLSN != c.FirstLSN || got.LastLSN != c.LastLSN || got.LastCommit != c.LastCommit {
		return nil, corrupt(name, "holds LSNs %d..%d of epoch %d (last commit %d), its name says otherwise", got.FirstLSN, got.LastLSN, got.Epoch, got.LastCommit)
	}
	return envs, nil
}

// --- histories ----------------------------------------------------------

// PutHistory uploads the epoch history of the log up to the start of
// epoch e (its last line), before any chunk of e.
func (a *Archive) PutHistory(ctx context.Context, cluster string, e uint64, h datadir.History) error {
	if len(h) == 0 || h.Current().Epoch != e {
		return fmt.Errorf("archive: history %v does not end with epoch %d", h, e)
	}
	return a.put(ctx, historyName(e), cluster, h.Marshal(), nil)
}

// GetHistory downloads epoch e's history.
func (a *Archive) GetHistory(ctx context.Context, cluster string, e uint64) (datadir.History, error) {
	name := historyName(e)
	b, _, err := a.get(ctx, name, cluster, maxSmallBytes)
	if err != nil {
		return nil, err
	}
	h, err := datadir.ParseHistory(name, b)
	if err != nil {
		return nil, corrupt(name, "%v", err)
	}
	if len(h) == 0 || h.Current().Epoch != e {
		return nil, corrupt(name, "history %v does not end with epoch %d", h, e)
	}
	if err := h.Check(e, 0); err != nil { // an epoch or first LSN of 0
		return nil, corrupt(name, "history%v", err)
	}
	return h, nil
}

// --- downloads that stream ------------------------------------------------

// hashingReader hashes what it reads and, at the end, checks the object's
// size and checksum: a reader of it sees io.EOF only after the check
// passed, so a consumer that acts only at EOF never acts on bad bytes.
type hashingReader struct {
	name    string
	r       io.Reader
	h       hash.Hash
	n       int64
	info    Info
	cluster string
}

func (h *hashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	h.n += int64(n)
	if errors.Is(err, io.EOF) {
		if cerr := checkStored(h.name, h.info, h.cluster, h.n, hex.EncodeToString(h.h.Sum(nil))); cerr != nil {
			return n, cerr
		}
	}
	return n, err
}

// Download copies the stored bytes of name to w, checking its size and
// checksum (and cluster) as it goes: an error, not io.EOF, ends a bad
// object. It returns the object's metadata.
func (a *Archive) Download(ctx context.Context, name, cluster string, w io.Writer) (Info, error) {
	rc, info, err := a.bucket.Get(ctx, name)
	if err != nil {
		return Info{}, err
	}
	defer rc.Close()
	hr := &hashingReader{name: name, r: rc, h: sha256.New(), info: info, cluster: cluster}
	if _, err := io.Copy(w, hr); err != nil {
		var ce *CorruptError
		if errors.As(err, &ce) {
			return Info{}, err
		}
		return Info{}, fmt.Errorf("%s: read %s: %w", a.bucket, name, err)
	}
	return info, nil
}

// --- base snapshots -----------------------------------------------------

// PutSnapshot uploads a base snapshot file (docs/FORMAT.md, *Base
// snapshots*: the log store's file, byte for byte) as ref: f holds size
// bytes. Encrypted archives seal it into a temporary file in tmpDir
// first; either way it is read twice (once for its checksum, which goes
// in the metadata, then for the upload), never held in memory.
func (a *Archive) PutSnapshot(ctx context.Context, cluster string, ref SnapshotRef, f io.ReadSeeker, size int64, tmpDir string) error {
	name := SnapshotName(ref)
	meta := map[string]string{metaFormat: formatVersion, metaCluster: cluster, metaPlain: strconv.FormatInt(size, 10)}
	body, bodySize := f, size
	if a.keys != nil {
		tmp, err := os.CreateTemp(tmpDir, "archive-seal-*")
		if err != nil {
			return err
		}
		defer os.Remove(tmp.Name())
		defer tmp.Close()
		n, err := a.keys.SealStream(name, io.LimitReader(f, size), tmp)
		if err != nil {
			return fmt.Errorf("encrypt %s: %w", name, err)
		}
		body, bodySize = tmp, n
		meta[metaKeyID] = a.keys.Current()
	}
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return err
	}
	h := sha256.New()
	if n, err := io.Copy(h, io.LimitReader(body, bodySize)); err != nil || n != bodySize {
		return fmt.Errorf("checksum %s: read %d of %d bytes: %v", name, n, bodySize, err)
	}
	meta[metaSHA256] = hex.EncodeToString(h.Sum(nil))
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return a.bucket.Put(withPayloadSHA256(ctx, meta[metaSHA256]), name, body, bodySize, meta)
}

// SnapshotTempPattern is the name (a filepath.Glob pattern) of the
// temporary files FetchSnapshot makes: a caller whose process may crash
// during a download removes leftovers by it.
const SnapshotTempPattern = "archive-snapshot-*"

// FetchSnapshot downloads the snapshot ref into a new file in tmpDir,
// checking its checksum and decrypting it, and returns the file (at
// offset 0, holding the base snapshot file's bytes) and its size. The
// caller closes and removes it.
func (a *Archive) FetchSnapshot(ctx context.Context, cluster string, ref SnapshotRef, tmpDir string) (*os.File, int64, error) {
	name := SnapshotName(ref)
	stored, err := os.CreateTemp(tmpDir, SnapshotTempPattern)
	if err != nil {
		return nil, 0, err
	}
	ok := false
	defer func() {
		if !ok {
			stored.Close()
			os.Remove(stored.Name())
		}
	}()
	info, err := a.Download(ctx, name, cluster, stored)
	if err != nil {
		return nil, 0, err
	}
	if info.Meta[metaKeyID] != "" {
		if _, err := stored.Seek(0, io.SeekStart); err != nil {
			return nil, 0, err
		}
		plain, err := os.CreateTemp(tmpDir, SnapshotTempPattern)
		if err != nil {
			return nil, 0, err
		}
		r, err := a.open(name, info, stored, info.Size)
		if err == nil {
			_, err = io.Copy(plain, r)
			if err != nil {
				err = corrupt(name, "%v", err)
			}
		}
		stored.Close()
		os.Remove(stored.Name())
		stored = plain
		if err != nil {
			return nil, 0, err
		}
	}
	size, err := stored.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, 0, err
	}
	if want := info.Meta[metaPlain]; want != "" && want != strconv.FormatInt(size, 10) {
		return nil, 0, corrupt(name, "%d bytes, its metadata says %s", size, want)
	}
	if _, err := stored.Seek(0, io.SeekStart); err != nil {
		return nil, 0, err
	}
	ok = true
	return stored, size, nil
}
