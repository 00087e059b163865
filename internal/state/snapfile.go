package state

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/walship/walship/internal/vfs"
)

// keepSnapshots is how many snapshots SaveSnapshot leaves in a directory:
// the new one and the previous one, so that LoadLatestSnapshot has something
// to fall back on if the newest turns out to be corrupt.
const keepSnapshots = 2

const (
	snapPrefix = "snapshot-"
	snapSuffix = ".snap"
	tmpSuffix  = ".tmp"
)

// SnapshotName returns the file name of the snapshot at lsn:
// snapshot-<lsn as 20 decimal digits>.snap, so names sort by LSN.
func SnapshotName(lsn uint64) string {
	return fmt.Sprintf("%s%020d%s", snapPrefix, lsn, snapSuffix)
}

// parseSnapshotName returns the LSN in a name made by SnapshotName.
func parseSnapshotName(name string) (uint64, bool) {
	digits, ok := strings.CutPrefix(name, snapPrefix)
	if !ok {
		return 0, false
	}
	if digits, ok = strings.CutSuffix(digits, snapSuffix); !ok || len(digits) != 20 {
		return 0, false
	}
	lsn, err := strconv.ParseUint(digits, 10, 64)
	return lsn, err == nil
}

// SaveSnapshot durably writes v to dir as SnapshotName(v.AppliedLSN()) and
// returns its path. It writes a temporary file, syncs it, renames it into
// place and syncs dir, so a crash leaves either the complete snapshot or
// none. It then removes all but the newest two snapshots and any leftover
// temporary files; if only that clean-up fails, it returns the path of the
// durable snapshot together with the error.
//
// Calls for the same dir must not run concurrently (the clean-up would
// remove the other call's temporary file).
func SaveSnapshot(fsys vfs.FS, dir string, v *View) (path string, err error) {
	final := filepath.Join(dir, SnapshotName(v.AppliedLSN()))
	tmp := final + tmpSuffix
	if err := writeSnapshotFile(fsys, tmp, v); err != nil {
		// Best effort: the temporary file is garbage either way, and the
		// next SaveSnapshot removes it if this fails too.
		_ = fsys.Remove(tmp)
		return "", err
	}
	if err := fsys.Rename(tmp, final); err != nil {
		_ = fsys.Remove(tmp)
		return "", fmt.Errorf("state: save snapshot: %w", err)
	}
	if err := fsys.SyncDir(dir); err != nil {
		return "", fmt.Errorf("state: save snapshot: sync dir: %w", err)
	}
	if err := pruneSnapshots(fsys, dir, final); err != nil {
		return final, fmt.Errorf("state: save snapshot: prune: %w", err)
	}
	return final, nil
}

func writeSnapshotFile(fsys vfs.FS, name string, v *View) error {
	f, err := fsys.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, vfs.FilePerm)
	if err != nil {
		return fmt.Errorf("state: save snapshot: %w", err)
	}
	if err := WriteSnapshot(f, v); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("state: save snapshot: sync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("state: save snapshot: close: %w", err)
	}
	return nil
}

type snapFile struct {
	path string
	lsn  uint64
}

// listSnapshots returns dir's snapshots, newest first, and its leftover
// temporary files.
func listSnapshots(fsys vfs.FS, dir string) (snaps []snapFile, tmps []string, err error) {
	ents, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() {
			continue
		}
		if lsn, ok := parseSnapshotName(name); ok {
			snaps = append(snaps, snapFile{path: filepath.Join(dir, name), lsn: lsn})
		} else if base, ok := strings.CutSuffix(name, tmpSuffix); ok {
			if _, ok := parseSnapshotName(base); ok {
				tmps = append(tmps, filepath.Join(dir, name))
			}
		}
	}
	slices.SortFunc(snaps, func(a, b snapFile) int { return cmp.Compare(b.lsn, a.lsn) })
	return snaps, tmps, nil
}

func pruneSnapshots(fsys vfs.FS, dir, keep string) error {
	snaps, tmps, err := listSnapshots(fsys, dir)
	if err != nil {
		return err
	}
	var errs []error
	for i, s := range snaps {
		if i < keepSnapshots || s.path == keep {
			continue
		}
		if err := fsys.Remove(s.path); err != nil {
			errs = append(errs, err)
		}
	}
	for _, t := range tmps {
		if err := fsys.Remove(t); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// LoadLatestSnapshot loads the newest valid snapshot in dir and returns it
// with its path. With no snapshot (or no dir) it returns an empty store and
// an empty path: a node starting from scratch.
//
// If the newest snapshot is corrupt (its content, or an applied LSN that
// disagrees with its name), it falls back to the next newest, and so on:
// SaveSnapshot keeps the previous snapshot for exactly this, and an older
// snapshot is still correct state, only further behind, so replaying the WAL
// (or fetching from the primary) from its LSN catches up. The caller must
// therefore keep the WAL from the oldest kept snapshot, not the newest. If
// every snapshot is corrupt the error wraps [ErrCorruptSnapshot]. An I/O
// error is returned at once rather than skipped, since it says nothing about
// whether the snapshot is good.
func LoadLatestSnapshot(fsys vfs.FS, dir string) (*Store, string, error) {
	snaps, _, err := listSnapshots(fsys, dir)
	if errors.Is(err, fs.ErrNotExist) {
		return New(), "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("state: load snapshot: %w", err)
	}
	var corrupt []error
	for _, sf := range snaps {
		s, err := loadSnapshotFile(fsys, sf)
		switch {
		case err == nil:
			return s, sf.path, nil
		case errors.Is(err, ErrCorruptSnapshot):
			corrupt = append(corrupt, err)
		default:
			return nil, "", err
		}
	}
	if len(corrupt) > 0 {
		return nil, "", fmt.Errorf("state: load snapshot: no valid snapshot in %s: %w", dir, errors.Join(corrupt...))
	}
	return New(), "", nil
}

func loadSnapshotFile(fsys vfs.FS, sf snapFile) (*Store, error) {
	f, err := fsys.OpenFile(sf.path, os.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("state: load snapshot: %w", err)
	}
	defer f.Close() // read-only: a close error loses nothing
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("state: load snapshot: %w", err)
	}
	if fi.Size() == 0 {
		// 0 would mean "no limit" to ReadSnapshot; an empty file is simply
		// truncated.
		return nil, fmt.Errorf("state: load snapshot %s: %w: empty file", sf.path, ErrCorruptSnapshot)
	}
	s, err := ReadSnapshot(f, fi.Size())
	if err != nil {
		return nil, fmt.Errorf("state: load snapshot %s: %w", sf.path, err)
	}
	if s.AppliedLSN() != sf.lsn {
		return nil, fmt.Errorf("state: load snapshot %s: %w: applied LSN %d does not match the name",
			sf.path, ErrCorruptSnapshot, s.AppliedLSN())
	}
	return s, nil
}

// RemoveSnapshotsAbove removes every snapshot of an LSN above lsn and syncs
// the directory: for a replica whose state moves backwards (re-seeded after
// it applied entries its primary lost), so that no later recovery loads one.
func RemoveSnapshotsAbove(fsys vfs.FS, dir string, lsn uint64) error {
	snaps, _, err := listSnapshots(fsys, dir)
	if err != nil {
		return fmt.Errorf("state: remove snapshots: %w", err)
	}
	removed := false
	for _, s := range snaps {
		if s.lsn > lsn {
			if err := fsys.Remove(s.path); err != nil {
				return fmt.Errorf("state: remove snapshot: %w", err)
			}
			removed = true
		}
	}
	if removed {
		if err := fsys.SyncDir(dir); err != nil {
			return fmt.Errorf("state: remove snapshots: sync dir: %w", err)
		}
	}
	return nil
}
