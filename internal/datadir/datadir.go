// Package datadir holds the small files of a node's data directory beside
// its WAL (wal/) and snapshots (snapshots/), for every kind of node:
//
//	cluster   the id of the cluster the directory belongs to, one line
//	          (see Cluster): made by the cluster's first primary, adopted
//	          by every other node from the first peer it hears from
//	vote      the highest epoch the node has promised to (a fence, or a
//	          primary it followed), and that epoch's primary
//	logprimary  the primary of the newest epoch of the node's log, once
//	          the vote names a newer epoch (see SaveLogPrimary)
//	epochs    the epoch history of the node's log: one "epoch first_lsn"
//	          line per epoch that wrote part of it
//	applied   (replicas) an LSN the node had applied, and whether reads
//	          were served there (AppliedMarker)
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
	logPrimary  = "logprimary"
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
	return parseVote("vote", filepath.Join(dir, voteFile), b)
}

// parseVote parses the line of a vote file (what, at path).
func parseVote(what, path string, b []byte) (Vote, error) {
	f := strings.Fields(string(b))
	var v Vote
	var err error
	if len(f) >= 1 {
		v.Epoch, err = strconv.ParseUint(f[0], 10, 64)
	}
	if len(f) < 1 || len(f) > 3 || err != nil {
		return Vote{}, fmt.Errorf("%s file %s holds %q: want \"epoch [primary_id [primary_addr]]\"", what, path, b)
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
	if err := vfs.WriteFileAtomic(fsys, filepath.Join(dir, voteFile), voteLine(v)); err != nil {
		return fmt.Errorf("save vote %v: %w", v, err)
	}
	return nil
}

func voteLine(v Vote) []byte {
	return fmt.Appendf(nil, "%d %s %s\n", v.Epoch, quote(v.Primary), quote(v.Addr))
}

// LoadLogPrimary reads dir's log primary (SaveLogPrimary); a directory
// without one reads as the zero Vote.
func LoadLogPrimary(fsys vfs.FS, dir string) (Vote, error) {
	path := filepath.Join(dir, logPrimary)
	b, err := vfs.ReadFile(fsys, path)
	if errors.Is(err, os.ErrNotExist) {
		return Vote{}, nil
	}
	if err != nil {
		return Vote{}, fmt.Errorf("read log primary: %w", err)
	}
	return parseVote("log primary", path, b)
}

// SaveLogPrimary durably replaces dir's log primary: v, a promise of the
// epoch the node's log ends in that named its primary, kept before a
// promise of a newer epoch replaces it (failover.State.KeepsLogPrimary),
// in the vote file's form. It names that primary only while the log still
// ends in v's epoch.
func SaveLogPrimary(fsys vfs.FS, dir string, v Vote) error {
	if err := vfs.WriteFileAtomic(fsys, filepath.Join(dir, logPrimary), voteLine(v)); err != nil {
		return fmt.Errorf("save log primary %v: %w", v, err)
	}
	return nil
}

// ValidateNodeID checks a node id — a flag's, or one a peer states: 1..64
// of [A-Za-z0-9._-], and not "-", which the vote, log-primary and
// election files write for no node (a node named "-" would read back from
// its own promise as no one). The error quotes the id; the caller names
// the field.
func ValidateNodeID(id string) error {
	ok := len(id) >= 1 && len(id) <= 64
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	switch {
	case !ok:
		return fmt.Errorf("%s is not 1..64 of [A-Za-z0-9._-]", clip(id))
	case id == "-":
		return errors.New(`"-" is how a vote file writes no node: not a node id`)
	}
	return nil
}

// ValidateAddr checks an advertised address a peer states (a candidate's,
// a primary's), which a node keeps in its vote, log-primary or election
// file: one line of space-separated fields, "-" for an empty one. A field
// with white space in it would make the file unreadable at the next start,
// so an address is 1..255 bytes of printable ASCII other than the space,
// and not "-". The caller names the field.
func ValidateAddr(addr string) error {
	ok := len(addr) >= 1 && len(addr) <= 255 && addr != "-"
	for i := 0; ok && i < len(addr); i++ {
		ok = '!' <= addr[i] && addr[i] <= '~'
	}
	if !ok {
		return fmt.Errorf("%s is not an address: 1..255 bytes of printable ASCII, no spaces, not \"-\"", clip(addr))
	}
	return nil
}

// ValidatePrimary checks the primary a peer names — its id and address,
// either may be empty — before a node keeps it in its vote file. The
// error names the field (primary_id or primary_addr); the caller says
// whose.
func ValidatePrimary(id, addr string) error {
	if id != "" {
		if err := ValidateNodeID(id); err != nil {
			return fmt.Errorf("primary_id: %w", err)
		}
	}
	if addr != "" {
		if err := ValidateAddr(addr); err != nil {
			return fmt.Errorf("primary_addr: %w", err)
		}
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

// AppliedMarker is a replica's DataDir/applied: LSN is an LSN it had
// applied (so its primary had made every batch up to it durable), the
// point a restart replays its log to. Readable says more: LSN was at or
// below a commit watermark the replica had heard, saved before any read
// or watch was served at it, so a restart may serve reads there at once
// without going back in time or past what the contract acknowledged.
// Markers written before the readable form existed hold the applied LSN
// alone, possibly above the watermark: Readable false.
type AppliedMarker struct {
	LSN      uint64
	Readable bool
}

// readableSuffix follows the LSN in a readable marker: "<lsn> readable\n".
// A bare "<lsn>\n" is the older form (applied, readability unknown), which
// is also what a version that predates the suffix reads and writes; such a
// version refuses the suffixed form as "not a number" and replays up to
// its newest snapshot, which is safe.
const readableSuffix = "readable"

// ParseApplied decodes an applied marker's bytes (path names it in errors).
func ParseApplied(path string, b []byte) (AppliedMarker, error) {
	f := strings.Fields(string(b))
	var m AppliedMarker
	var err error
	switch {
	case len(f) == 1:
	case len(f) == 2 && f[1] == readableSuffix:
		m.Readable = true
	default:
		return AppliedMarker{}, fmt.Errorf("%s holds %q: want \"<lsn>\" or \"<lsn> readable\"", path, b)
	}
	if m.LSN, err = strconv.ParseUint(f[0], 10, 64); err != nil {
		return AppliedMarker{}, fmt.Errorf("%s holds %q, not a number: %w", path, b, err)
	}
	return m, nil
}

// Marshal encodes m as ParseApplied reads it.
func (m AppliedMarker) Marshal() []byte {
	s := strconv.FormatUint(m.LSN, 10)
	if m.Readable {
		s += " " + readableSuffix
	}
	return []byte(s + "\n")
}

// LoadAppliedMarker reads dir's applied marker; a missing one is the zero
// AppliedMarker.
func LoadAppliedMarker(fsys vfs.FS, dir string) (AppliedMarker, error) {
	path := filepath.Join(dir, appliedFile)
	b, err := vfs.ReadFile(fsys, path)
	if errors.Is(err, os.ErrNotExist) {
		return AppliedMarker{}, nil
	}
	if err != nil {
		return AppliedMarker{}, err
	}
	return ParseApplied(path, b)
}

// LoadApplied reads dir's applied marker's LSN: an LSN the node had
// applied as a replica, 0 when there is none.
func LoadApplied(fsys vfs.FS, dir string) (uint64, error) {
	m, err := LoadAppliedMarker(fsys, dir)
	return m.LSN, err
}

// SaveApplied replaces dir's applied marker with lsn, applied but not
// known readable (see SaveAppliedMarker).
func SaveApplied(fsys vfs.FS, dir string, lsn uint64, durable bool) error {
	return SaveAppliedMarker(fsys, dir, AppliedMarker{LSN: lsn}, durable)
}

// SaveAppliedMarker replaces dir's applied marker with m: durably when
// durable, else by a write and a rename without fsync, which survives a
// crash of the process but not of the machine.
func SaveAppliedMarker(fsys vfs.FS, dir string, m AppliedMarker, durable bool) error {
	path, data := filepath.Join(dir, appliedFile), m.Marshal()
	if durable {
		return vfs.WriteFileAtomic(fsys, path, data)
	}
	tmp := path + ".tmp"
	if err := vfs.WriteFile(fsys, tmp, data, vfs.FilePerm); err != nil {
		return err
	}
	return fsys.Rename(tmp, path)
}
