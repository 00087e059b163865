//go:build !linux

package vfs

import "os"

// fdatasync falls back to fsync where the platform has no fdatasync that Go
// exposes; it is at least as strong.
func fdatasync(f *os.File) error { return f.Sync() }
