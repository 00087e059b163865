package archive

import (
	"context"
	"errors"
	"io"
)

// ErrNotFound is what a Bucket returns for an object it does not hold.
var ErrNotFound = errors.New("no such object")

// Object is one object of a bucket, as a listing names it.
type Object struct {
	// Name is the object's key relative to the archive's prefix.
	Name string
	// Size is its stored size in bytes.
	Size int64
}

// Bucket is the object store an archive lives in: an S3-compatible
// bucket (s3.go) or a local directory (file.go). Names are relative to
// the archive's prefix and use '/' as separator. Put is atomic: a reader
// sees the whole object with its metadata, or nothing (S3's PUT; a rename
// for a directory); an interrupted upload leaves no object behind.
type Bucket interface {
	// Put stores body (size bytes) as name with metadata meta, replacing
	// any object of that name.
	Put(ctx context.Context, name string, body io.ReadSeeker, size int64, meta map[string]string) error
	// Get opens name for reading; the caller closes it. ErrNotFound if it
	// does not exist.
	Get(ctx context.Context, name string) (io.ReadCloser, Info, error)
	// Head is Get without the body.
	Head(ctx context.Context, name string) (Info, error)
	// List calls fn for every object whose name starts with prefix, in
	// ascending byte order of names, after startAfter (if not empty),
	// until fn returns false.
	List(ctx context.Context, prefix, startAfter string, fn func(Object) bool) error
	// Delete removes the named objects; missing ones are not an error.
	Delete(ctx context.Context, names ...string) error
	// String names the bucket for messages (s3://bucket/prefix, file:///dir).
	String() string
}

// Info is what a Bucket knows of a stored object besides its bytes.
type Info struct {
	Size int64
	Meta map[string]string
}
