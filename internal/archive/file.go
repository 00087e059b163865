package archive

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// fileBucket is a Bucket in a local directory (file:///path): for a
// single machine, a mounted network filesystem, and trying the archive
// without an object store. Each object is one file holding its metadata
// in front of its bytes (docs/FORMAT.md, *Archive*), written to a
// temporary name, fsynced and renamed, so that it appears whole or not at
// all, like an S3 PUT.
type fileBucket struct {
	root string
}

// fileMagic starts every object file of a file bucket.
const fileMagic = "WSHPOBJ1"

// maxFileMeta bounds the metadata of one object file.
const maxFileMeta = 64 << 10

// tmpMark is in the names of files being written; they are no objects.
const tmpMark = ".tmp-"

func newFileBucket(root string) (*fileBucket, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("file archive: %q is not an absolute path", root)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("file archive: %w", err)
	}
	return &fileBucket{root: filepath.Clean(root)}, nil
}

func (b *fileBucket) String() string { return "file://" + b.root }

func (b *fileBucket) path(name string) (string, error) {
	if name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, tmpMark) {
		return "", fmt.Errorf("file archive: bad object name %q", name)
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", fmt.Errorf("file archive: bad object name %q", name)
		}
	}
	return filepath.Join(b.root, filepath.FromSlash(name)), nil
}

func (b *fileBucket) Put(ctx context.Context, name string, body io.ReadSeeker, size int64, meta map[string]string) error {
	p, err := b.path(name)
	if err != nil {
		return err
	}
	mb, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	if len(mb) > maxFileMeta {
		return fmt.Errorf("file archive: metadata of %s is %d bytes, more than %d", name, len(mb), maxFileMeta)
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := p + tmpMark + hex.EncodeToString(rnd[:])
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	var hdr [12]byte
	copy(hdr[:8], fileMagic)
	binary.LittleEndian.PutUint32(hdr[8:], uint32(len(mb)))
	if _, err := f.Write(append(hdr[:], mb...)); err != nil {
		return err
	}
	n, err := io.Copy(f, &ctxReader{ctx: ctx, r: body})
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("file archive: %s: wrote %d bytes, want %d", name, n, size)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		return err
	}
	ok = true
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ctxReader stops a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// open opens name and reads its metadata; the file is positioned at its
// bytes.
func (b *fileBucket) open(name string) (*os.File, Info, error) {
	p, err := b.path(name)
	if err != nil {
		return nil, Info{}, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Info{}, fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, Info{}, err
	}
	info, err := readFileMeta(f, name)
	if err != nil {
		f.Close()
		return nil, Info{}, err
	}
	return f, info, nil
}

func readFileMeta(f *os.File, name string) (Info, error) {
	st, err := f.Stat()
	if err != nil {
		return Info{}, err
	}
	var hdr [12]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil || !bytes.Equal(hdr[:8], []byte(fileMagic)) {
		return Info{}, fmt.Errorf("file archive: %s is not an object file", name)
	}
	n := int64(binary.LittleEndian.Uint32(hdr[8:]))
	if n > maxFileMeta || 12+n > st.Size() {
		return Info{}, fmt.Errorf("file archive: %s: metadata length %d does not fit", name, n)
	}
	mb := make([]byte, n)
	if _, err := io.ReadFull(f, mb); err != nil {
		return Info{}, fmt.Errorf("file archive: %s: %w", name, err)
	}
	info := Info{Size: st.Size() - 12 - n}
	if err := json.Unmarshal(mb, &info.Meta); err != nil {
		return Info{}, fmt.Errorf("file archive: %s: metadata: %w", name, err)
	}
	return info, nil
}

func (b *fileBucket) Get(_ context.Context, name string) (io.ReadCloser, Info, error) {
	return b.open(name)
}

func (b *fileBucket) Head(_ context.Context, name string) (Info, error) {
	f, info, err := b.open(name)
	if err != nil {
		return Info{}, err
	}
	f.Close()
	return info, nil
}

func (b *fileBucket) List(ctx context.Context, prefix, startAfter string, fn func(Object) bool) error {
	var objs []Object
	err := filepath.WalkDir(b.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() || strings.Contains(d.Name(), tmpMark) {
			return nil
		}
		rel, err := filepath.Rel(b.root, p)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		if !strings.HasPrefix(name, prefix) || (startAfter != "" && name <= startAfter) {
			return nil
		}
		objs = append(objs, Object{Name: name})
		return ctx.Err()
	})
	if err != nil {
		return err
	}
	sort.Slice(objs, func(i, j int) bool { return objs[i].Name < objs[j].Name })
	for _, o := range objs {
		// The object's size is the file's without its metadata.
		f, info, err := b.open(o.Name)
		if errors.Is(err, ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return err
		}
		f.Close()
		o.Size = info.Size
		if !fn(o) {
			return nil
		}
	}
	return nil
}

func (b *fileBucket) Delete(_ context.Context, names ...string) error {
	dirs := map[string]bool{}
	for _, name := range names {
		p, err := b.path(name)
		if err != nil {
			return err
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		dirs[filepath.Dir(p)] = true
	}
	for d := range dirs {
		if err := syncDir(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
