package vfs

import (
	"fmt"
	"os"
)

// OSFS is the operating system's filesystem. The zero value is ready to use
// and it holds no state.
type OSFS struct{}

// OS is the real filesystem, the default wherever an FS is optional.
var OS FS = OSFS{}

// osFile is an *os.File whose Sync is fdatasync where the platform has it:
// a WAL only needs its data and size to be durable, not its mtime, and
// fdatasync skips the extra inode write that fsync would force.
type osFile struct {
	*os.File
}

func (f osFile) Sync() error { return fdatasync(f.File) }

// OpenFile implements FS.
func (OSFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

// Remove implements FS.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// Rename implements FS.
func (OSFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// ReadDir implements FS.
func (OSFS) ReadDir(dir string) ([]os.DirEntry, error) { return os.ReadDir(dir) }

// MkdirAll implements FS.
func (OSFS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }

// Stat implements FS.
func (OSFS) Stat(name string) (os.FileInfo, error) { return os.Stat(name) }

// SyncDir implements FS by fsyncing the directory itself, which is what makes
// entries created, removed or renamed in it durable on Linux filesystems.
func (OSFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	serr := d.Sync()
	cerr := d.Close()
	if serr != nil {
		return fmt.Errorf("sync dir %s: %w", dir, serr)
	}
	return cerr
}
