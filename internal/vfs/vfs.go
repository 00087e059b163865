// Package vfs is the small filesystem interface walship's storage code is
// written against, so that tests can replace the operating system with an
// in-memory filesystem that loses unsynced data on a simulated crash and
// injects I/O faults.
//
// Two implementations exist:
//
//   - [OS], the real filesystem. [File.Sync] is fdatasync(2) on Linux (the
//     file's data and the metadata needed to read it back, such as its size,
//     but not its timestamps) and fsync(2) elsewhere. [FS.SyncDir] fsyncs a
//     directory so that creations, removals and renames in it survive a
//     crash.
//   - [MemFS], from [NewMem], which models the durability rules a crash-safe
//     program must follow: file contents are durable only up to the last
//     successful [File.Sync], and directory entries (creations, removals,
//     renames) only up to the last successful [FS.SyncDir] of their
//     directory. [MemFS.Crash] throws away everything else; in particular an
//     unsynced overwrite of synced bytes reverts to the synced bytes.
//
// The interface is deliberately smaller than package os: only what a
// write-ahead log or a snapshot store needs.
package vfs

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// DirPerm and FilePerm are the modes walship creates its data with: the
// WAL, snapshots, votes and orphans are the database, readable by the
// process's user alone. A directory that exists keeps its mode (a
// Kubernetes volume's root is the kubelet's to set, for fsGroup; a
// directory an older walship made 0755 is the operator's to tighten).
const (
	DirPerm  os.FileMode = 0o700
	FilePerm os.FileMode = 0o600
)

// File is an open file. A File is not safe for concurrent use except that
// ReadAt may be called concurrently with other methods, and Sync
// concurrently with Write and WriteAt, as with *os.File.
type File interface {
	io.Reader
	io.ReaderAt
	io.Writer
	// WriteAt writes at an absolute offset without moving the file offset,
	// extending the file (with zeros in any gap) if it writes past the end.
	// As with *os.File, it fails on a file opened with os.O_APPEND.
	io.WriterAt
	io.Seeker
	// Sync makes the file's contents durable (fdatasync on Linux). It does
	// not make the file's directory entry durable; see FS.SyncDir.
	Sync() error
	// Truncate changes the size of the file.
	Truncate(size int64) error
	// Close releases the file.
	Close() error
	// Stat describes the file.
	Stat() (os.FileInfo, error)
	// Name returns the name the file was opened with.
	Name() string
}

// FS is a filesystem. Names are slash-separated paths in the style of package
// os; every method is safe for concurrent use.
type FS interface {
	// OpenFile opens a file with os.OpenFile's flag and permission semantics
	// (os.O_RDONLY, os.O_WRONLY, os.O_RDWR, os.O_CREATE, os.O_EXCL,
	// os.O_TRUNC and os.O_APPEND are honoured).
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	// Remove removes a file or an empty directory.
	Remove(name string) error
	// Rename renames a file, replacing newname if it exists.
	Rename(oldname, newname string) error
	// ReadDir lists a directory, sorted by name.
	ReadDir(dir string) ([]os.DirEntry, error)
	// MkdirAll creates a directory and any missing parents.
	MkdirAll(dir string, perm os.FileMode) error
	// SyncDir makes the entries of dir (creations, removals and renames of
	// the files in it) durable.
	SyncDir(dir string) error
	// Stat describes a file or directory.
	Stat(name string) (os.FileInfo, error)
}

// ErrInjected is a convenience error for fault-injection hooks; nothing in
// this package returns it on its own.
var ErrInjected = errors.New("vfs: injected fault")

// ReadFile reads a whole file from fs.
func ReadFile(fs FS, name string) ([]byte, error) {
	f, err := fs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// WriteFile creates or truncates name and writes data to it. It does not sync:
// callers that need durability call Sync and SyncDir themselves.
func WriteFile(fs FS, name string, data []byte, perm os.FileMode) error {
	f, err := fs.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	n, err := f.Write(data)
	if err == nil && n < len(data) {
		err = io.ErrShortWrite
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}
