// Package datadir holds the small files of a node's data directory beside
// its WAL (wal/) and snapshots (snapshots/), for every kind of node:
//
//	cluster   the id of the cluster the directory belongs to, one line
//	          (see Cluster): made by the cluster's first primary, adopted
//	          by every other node from the first peer it hears from
//	vote      the highest epoch the node has promised to (a fence, or a
//	          primary it followed), and that epoch's primary
//	epochs    the epoch history of the node's log: one "epoch first_lsn"
//	          line per epoch that wrote part of it
//	applied   (replicas) an LSN the node had applied
//	orphans/  entries cut from the log because the cluster's history went
//	          another way, kept for an operator (see Orphan)
//
// Every file is replaced atomically (temporary file, fsync, rename, fsync
// of the directory) before what depends on it is acknowledged; the applied
// marker, which nothing acknowledged depends on, may also be replaced
// without the fsyncs (see SaveApplied).
package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/walship/walship/internal/vfs"
)

// Vote is the highest epoch a node has promised to: it refuses batches,
// appends and fences of any older epoch. Primary and Addr name that
// epoch's primary (empty when the epoch was learnt from a batch alone).
type Vote struct {
	Epoch   uint64
	Primary string // the primary's node id
	Addr    string // the primary's advertised gRPC address
}

func (v Vote) String() string {
	if v.Primary == "" && v.Addr == "" {
		return fmt.Sprintf("epoch %d", v.Epoch)
	}
	return fmt.Sprintf("epoch %d (primary %s at %s)", v.Epoch, v.Primary, v.Addr)
}

const (
	voteFile    = "vote"
	legacyEpoch = "epoch" // a single decimal epoch, as nodes wrote before votes
	historyFile = "epochs"
	appliedFile = "applied"
)

// LoadVote reads dir's vote. A directory without one reads as the epoch
// of its legacy epoch file, or the zero Vote.
func LoadVote(fsys vfs.FS, dir string) (Vote, error) {
	b, err := vfs.ReadFile(fsys, filepath.Join(dir, voteFile))
	if errors.Is(err, os.ErrNotExist) {
		e, err := loadUint(fsys, filepath.Join(dir, legacyEpoch))
		if err != nil {
			return Vote{}, fmt.Errorf("epoch file: %w", err)
		}
		return Vote{Epoch: e}, nil
	}
	if err != nil {
		return Vote{}, fmt.Errorf("read vote: %w", err)
	}
	f := strings.Fields(string(b))
	var v Vote
	if len(f) >= 1 {
		v.Epoch, err = strconv.ParseUint(f[0], 10, 64)
	}
	if len(f) < 1 || len(f) > 3 || err != nil {
		return Vote{}, fmt.Errorf("vote file %s holds %q: want \"epoch [primary_id [primary_addr]]\"", filepath.Join(dir, voteFile), b)
	}
	if len(f) > 1 {
		v.Primary = unquote(f[1])
	}
	if len(f) > 2 {
		v.Addr = unquote(f[2])
	}
	return v, nil
}

// SaveVote durably replaces dir's vote.
func SaveVote(fsys vfs.FS, dir string, v Vote) error {
	line := fmt.Sprintf("%d %s %s\n", v.Epoch, quote(v.Primary), quote(v.Addr))
	if err := vfs.WriteFileAtomic(fsys, filepath.Join(dir, voteFile), []byte(line)); err != nil {
		return fmt.Errorf("save vote %v: %w", v, err)
	}
	return nil
}

// quote keeps a field of a space-separated line non-empty ("-" for empty).
func quote(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func unquote(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

// loadUint reads a file holding one decimal number and a newline; a missing
// file reads as 0.
func loadUint(fsys vfs.FS, path string) (uint64, error) {
	b, err := vfs.ReadFile(fsys, path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s holds %q, not a number: %w", path, b, err)
	}
	return v, nil
}

// LoadApplied reads dir's applied marker: an LSN the node had applied as a
// replica, 0 when there is none.
func LoadApplied(fsys vfs.FS, dir string) (uint64, error) {
	return loadUint(fsys, filepath.Join(dir, appliedFile))
}

// SaveApplied replaces dir's applied marker with lsn: durably when durable,
// else by a write and a rename without fsync, for a replica that saves it
// often and for which a lost or stale marker only means waiting for its
// primary a little longer after a crash.
func SaveApplied(fsys vfs.FS, dir string, lsn uint64, durable bool) error {
	path, data := filepath.Join(dir, appliedFile), []byte(strconv.FormatUint(lsn, 10)+"\n")
	if durable {
		return vfs.WriteFileAtomic(fsys, path, data)
	}
	tmp := path + ".tmp"
	if err := vfs.WriteFile(fsys, tmp, data, vfs.FilePerm); err != nil {
		return err
	}
	return fsys.Rename(tmp, path)
}
