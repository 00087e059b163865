package vfs

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFileAtomic replaces name with data so that a crash leaves either the
// old or the new contents, never a mix, and the new contents are durable
// when it returns: it writes name+".tmp", syncs it, renames it over name and
// syncs the directory.
func WriteFileAtomic(fs FS, name string, data []byte) error {
	tmp := name + ".tmp"
	f, err := fs.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, FilePerm)
	if err != nil {
		return err
	}
	n, err := f.Write(data)
	if err == nil && n != len(data) {
		err = fmt.Errorf("write %s: short write", tmp)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fs.Rename(tmp, name)
	}
	if err == nil {
		err = fs.SyncDir(filepath.Dir(name))
	}
	return err
}
