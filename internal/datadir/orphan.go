package datadir

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
)

// Orphan is a file of log entries a node cut from its log because the
// cluster's history went another way: a deposed primary's tail that no
// quorum had, a replica's or a log store's entries of an epoch the new
// primary does not have. Nothing cut is ever deleted: the entries are
// kept, byte for byte as they were stored (WalBatch envelopes), in
// DATA_DIR/orphans/orphan-e<epoch>-<first>-<last>-<unix>.wal, for an
// operator to inspect or re-apply (docs/FORMAT.md, "Orphan files";
// docs/RUNBOOK.md).
type Orphan struct {
	Name              string
	Epoch             uint64 // epoch of the first cut entry
	FirstLSN, LastLSN uint64
	Entries           int
	Bytes             int64
	CutAt             time.Time
}

// OrphanEntry is one cut entry: its LSN range and stored bytes.
type OrphanEntry struct {
	FirstLSN, LastLSN uint64
	Data              []byte
}

const orphanDir = "orphans"

// orphanMagic starts every orphan file; each entry follows as
// first_lsn, last_lsn (8 bytes each, big-endian), length (4 bytes) and
// the stored envelope.
var orphanMagic = []byte("walship-orphan-v1\n")

// SaveOrphan writes entries (in LSN order, cut from a log whose first cut
// entry is of epoch epoch) to a new orphan file, durably, and returns it.
func SaveOrphan(fsys vfs.FS, dir string, epoch uint64, entries []OrphanEntry, now time.Time) (Orphan, error) {
	if len(entries) == 0 {
		return Orphan{}, errors.New("save orphan: no entries")
	}
	od := filepath.Join(dir, orphanDir)
	if err := fsys.MkdirAll(od, vfs.DirPerm); err != nil {
		return Orphan{}, fmt.Errorf("save orphan: %w", err)
	}
	o := Orphan{Epoch: epoch, FirstLSN: entries[0].FirstLSN, LastLSN: entries[len(entries)-1].LastLSN, Entries: len(entries), CutAt: now}
	o.Name = fmt.Sprintf("orphan-e%d-%d-%d-%d.wal", epoch, o.FirstLSN, o.LastLSN, now.UnixNano())
	buf := append([]byte(nil), orphanMagic...)
	for _, e := range entries {
		buf = binary.BigEndian.AppendUint64(buf, e.FirstLSN)
		buf = binary.BigEndian.AppendUint64(buf, e.LastLSN)
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(e.Data)))
		buf = append(buf, e.Data...)
	}
	o.Bytes = int64(len(buf))
	if err := vfs.WriteFileAtomic(fsys, filepath.Join(od, o.Name), buf); err != nil {
		return Orphan{}, fmt.Errorf("save orphan %s: %w", o.Name, err)
	}
	return o, nil
}

// ListOrphans lists dir's orphan files, oldest cut first.
func ListOrphans(fsys vfs.FS, dir string) ([]Orphan, error) {
	ents, err := fsys.ReadDir(filepath.Join(dir, orphanDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list orphans: %w", err)
	}
	var out []Orphan
	for _, de := range ents {
		o, ok := parseOrphanName(de.Name())
		if !ok {
			continue
		}
		if fi, err := fsys.Stat(filepath.Join(dir, orphanDir, de.Name())); err == nil {
			o.Bytes = fi.Size()
		}
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CutAt.Before(out[j].CutAt) })
	return out, nil
}

func parseOrphanName(name string) (Orphan, bool) {
	s, ok := strings.CutPrefix(name, "orphan-e")
	if !ok {
		return Orphan{}, false
	}
	if s, ok = strings.CutSuffix(s, ".wal"); !ok {
		return Orphan{}, false
	}
	f := strings.Split(s, "-")
	if len(f) != 4 {
		return Orphan{}, false
	}
	var n [4]uint64
	for i := range f {
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return Orphan{}, false
		}
		n[i] = v
	}
	return Orphan{Name: name, Epoch: n[0], FirstLSN: n[1], LastLSN: n[2], CutAt: time.Unix(0, int64(n[3]))}, true
}

// ReadOrphan reads the entries of an orphan file.
func ReadOrphan(fsys vfs.FS, dir, name string) ([]OrphanEntry, error) {
	b, err := vfs.ReadFile(fsys, filepath.Join(dir, orphanDir, name))
	if err != nil {
		return nil, err
	}
	return decodeOrphan(name, b)
}

func decodeOrphan(name string, b []byte) ([]OrphanEntry, error) {
	if len(b) < len(orphanMagic) || string(b[:len(orphanMagic)]) != string(orphanMagic) {
		return nil, fmt.Errorf("orphan %s: not an orphan file (bad magic)", name)
	}
	b = b[len(orphanMagic):]
	var out []OrphanEntry
	for off := len(orphanMagic); len(b) > 0; {
		if len(b) < 20 {
			return nil, fmt.Errorf("orphan %s: offset %d: %w", name, off, io.ErrUnexpectedEOF)
		}
		e := OrphanEntry{FirstLSN: binary.BigEndian.Uint64(b), LastLSN: binary.BigEndian.Uint64(b[8:])}
		n := binary.BigEndian.Uint32(b[16:])
		if uint64(n) > uint64(len(b)-20) {
			return nil, fmt.Errorf("orphan %s: offset %d: entry of %d bytes, %d left: %w", name, off, n, len(b)-20, io.ErrUnexpectedEOF)
		}
		if e.LastLSN < e.FirstLSN || (len(out) > 0 && e.FirstLSN != out[len(out)-1].LastLSN+1) {
			return nil, fmt.Errorf("orphan %s: offset %d: entry %d..%d does not continue the file", name, off, e.FirstLSN, e.LastLSN)
		}
		e.Data = b[20 : 20+n]
		out = append(out, e)
		b = b[20+n:]
		off += 20 + int(n)
	}
	return out, nil
}

// OrphanTail saves every entry of log after keep in a new orphan file,
// before the caller cuts them, and returns it and the number of records
// the entries hold. keep must end an entry. The caller holds the log's
// writer side.
func OrphanTail(fsys vfs.FS, dir string, log *wal.Log, keep uint64, now time.Time) (Orphan, uint64, error) {
	if log.LastLSN() <= keep {
		return Orphan{}, 0, nil
	}
	rd, err := log.NewReader(keep+1, false)
	if err != nil {
		return Orphan{}, 0, fmt.Errorf("read the entries to cut after LSN %d: %w", keep, err)
	}
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []OrphanEntry
	var epoch uint64
	for len(out) == 0 || out[len(out)-1].LastLSN < log.LastLSN() {
		e, err := rd.Next(ctx)
		if err != nil {
			return Orphan{}, 0, fmt.Errorf("read the entries to cut after LSN %d: %w", keep, err)
		}
		if len(out) == 0 {
			var env walshipv1.WalBatch
			if envelope.Unmarshal(e.Data, &env) == nil {
				epoch = env.GetEpoch()
			}
		}
		out = append(out, OrphanEntry{FirstLSN: e.FirstLSN, LastLSN: e.LastLSN, Data: append([]byte(nil), e.Data...)})
	}
	if out[0].FirstLSN != keep+1 {
		return Orphan{}, 0, fmt.Errorf("a cut after LSN %d falls inside the entry %d..%d", keep, out[0].FirstLSN, out[0].LastLSN)
	}
	o, err := SaveOrphan(fsys, dir, epoch, out, now)
	if err != nil {
		return Orphan{}, 0, err
	}
	return o, out[len(out)-1].LastLSN - keep, nil
}

// ReadOrphanFile reads the entries of the orphan file at path, wherever
// it is (an operator may have copied it out of DATA_DIR/orphans).
func ReadOrphanFile(fsys vfs.FS, path string) ([]OrphanEntry, error) {
	b, err := vfs.ReadFile(fsys, path)
	if err != nil {
		return nil, err
	}
	return decodeOrphan(filepath.Base(path), b)
}

// ParseOrphanName parses an orphan file's name
// (orphan-e<epoch>-<first>-<last>-<unix_nanos>.wal); Bytes is left 0.
func ParseOrphanName(name string) (Orphan, bool) { return parseOrphanName(name) }
