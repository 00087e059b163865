package vfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrCrashed is returned by every method of a MemFS file handle opened before
// the last MemFS.Crash: after a crash the process that held it is gone.
var ErrCrashed = errors.New("vfs: file handle invalidated by a simulated crash")

// Op names a filesystem operation for MemFS.InjectError.
type Op int

// The operations MemFS.InjectError can fail.
const (
	OpOpen Op = iota
	OpRead
	OpWrite
	OpSync
	OpTruncate
	OpClose
	OpStat
	OpRemove
	OpRename
	OpReadDir
	OpMkdirAll
	OpSyncDir
)

// String returns the operation's name.
func (o Op) String() string {
	switch o {
	case OpOpen:
		return "open"
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	case OpSync:
		return "sync"
	case OpTruncate:
		return "truncate"
	case OpClose:
		return "close"
	case OpStat:
		return "stat"
	case OpRemove:
		return "remove"
	case OpRename:
		return "rename"
	case OpReadDir:
		return "readdir"
	case OpMkdirAll:
		return "mkdirall"
	case OpSyncDir:
		return "syncdir"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// MemFS is an in-memory FS that models what survives a crash, for crash and
// fault-injection tests. Create one with NewMem.
//
// Durability model:
//
//   - Each file has its current contents and its synced contents. A
//     successful File.Sync makes the current contents the synced ones.
//   - Each directory has its current entries and its durable entries. A
//     successful SyncDir makes the current entries durable. Creating,
//     removing or renaming a file changes only the current entries, so a
//     file that was created and synced but whose directory was not synced
//     disappears on a crash, and a removed file whose removal was not synced
//     comes back.
//   - Directories themselves (MkdirAll) are durable at once, and cannot be
//     renamed; that is all walship needs and keeps the model small.
//
// Crash replaces the current state with the durable one and invalidates every
// open handle; CrashTorn additionally lets a random part of the unsynced
// writes survive, the way a real disk may persist some of a write's pages.
//
// Faults are injected with InjectWriteError, InjectSyncError and InjectError.
// Hooks run without MemFS's lock held, so they may call back into it.
type MemFS struct {
	mu   sync.Mutex
	dirs map[string]*memDir // keyed by cleaned path
	gen  uint64             // bumped by Crash; handles remember the gen they were opened in

	writeHook func(name string, off int64, p []byte) (int, error)
	syncHook  func(name string) error
	opHook    func(op Op, name string) error
}

type memDir struct {
	files   map[string]*memInode // current entries, by base name
	durable map[string]*memInode // entries as of the last successful SyncDir
}

type memInode struct {
	data   []byte // current contents
	synced []byte // contents as of the last successful Sync; never aliases data
	// dirtyLo is the lowest offset changed since the last Sync, or -1 when
	// data equals synced. Only data[dirtyLo:] needs copying on Sync, and it
	// is the region a torn crash may partly keep.
	dirtyLo int64
	// stable is the length of the prefix that has been part of the file
	// without interruption since the last Sync (a shrinking Truncate lowers
	// it). A torn crash may turn bytes at or past it to zeros (the new size
	// reached the disk, the data did not), but bytes below it were only
	// overwritten in place: they read back old or new, never zeros.
	stable int64
	mode   os.FileMode
}

// NewMem returns an empty in-memory filesystem whose roots "/" and "." exist.
func NewMem() *MemFS {
	m := &MemFS{dirs: map[string]*memDir{}}
	m.dirs["/"] = newMemDir()
	m.dirs["."] = newMemDir()
	return m
}

func newMemDir() *memDir {
	return &memDir{files: map[string]*memInode{}, durable: map[string]*memInode{}}
}

// InjectWriteError installs fn to be called before every File.Write and
// File.WriteAt with the file's name, the offset and the data. To let the
// write through, fn returns (len(p), nil). Otherwise only p[:n] is written
// and (n, err) is returned, so fn can fail a write (n == 0), tear it
// (0 < n < len(p) with an error), or make it silently short (n < len(p),
// nil error — which breaks the io.Writer contract on purpose, to test that
// callers check n). nil removes the hook.
func (m *MemFS) InjectWriteError(fn func(name string, off int64, p []byte) (n int, err error)) {
	m.mu.Lock()
	m.writeHook = fn
	m.mu.Unlock()
}

// InjectSyncError installs fn to be called before every File.Sync (with the
// file's name) and SyncDir (with the directory). A non-nil error fails the
// sync and nothing becomes durable. nil removes the hook.
func (m *MemFS) InjectSyncError(fn func(name string) error) {
	m.mu.Lock()
	m.syncHook = fn
	m.mu.Unlock()
}

// FailDirSyncAfterRemove makes every directory fsync fail with err once a
// file whose name ends in suffix has been removed — a disk that fails right
// after retention removed a WAL segment. It replaces the InjectError hook,
// and returns a func that reports whether such a removal has happened.
func (m *MemFS) FailDirSyncAfterRemove(suffix string, err error) (removed func() bool) {
	var done atomic.Bool
	m.InjectError(func(op Op, name string) error {
		switch {
		case op == OpRemove && strings.HasSuffix(name, suffix):
			done.Store(true)
		case op == OpSyncDir && done.Load():
			return err
		}
		return nil
	})
	return done.Load
}

// HoldNextSync makes the next File.Sync of a file whose name ends in
// suffix wait until release is called — a disk stuck in an fsync; later
// syncs do not wait. entered is closed once that sync has begun. It
// replaces the InjectSyncError hook; release may be called more than
// once (tests call it on cleanup too, so that what waits can stop).
func (m *MemFS) HoldNextSync(suffix string) (entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var held, released sync.Once
	m.InjectSyncError(func(name string) error {
		if strings.HasSuffix(name, suffix) {
			held.Do(func() {
				close(in)
				<-out
			})
		}
		return nil
	})
	return in, func() { released.Do(func() { close(out) }) }
}

// InjectError installs fn to be called before every operation; a non-nil
// error fails the operation without effect. Writes reach this hook as OpWrite
// before the InjectWriteError hook. nil removes the hook.
func (m *MemFS) InjectError(fn func(op Op, name string) error) {
	m.mu.Lock()
	m.opHook = fn
	m.mu.Unlock()
}

func (m *MemFS) checkOp(op Op, name string) error {
	m.mu.Lock()
	h := m.opHook
	m.mu.Unlock()
	if h == nil {
		return nil
	}
	if err := h(op, name); err != nil {
		return &os.PathError{Op: op.String(), Path: name, Err: err}
	}
	return nil
}

func (m *MemFS) checkSync(op Op, name string) error {
	if err := m.checkOp(op, name); err != nil {
		return err
	}
	m.mu.Lock()
	h := m.syncHook
	m.mu.Unlock()
	if h == nil {
		return nil
	}
	if err := h(name); err != nil {
		return &os.PathError{Op: op.String(), Path: name, Err: err}
	}
	return nil
}

// Crash simulates a machine crash: every file loses what was written since
// its last successful Sync, every directory loses the entries created,
// removed or renamed since its last successful SyncDir, and every open handle
// starts failing with ErrCrashed. The MemFS stays usable, as after a reboot.
func (m *MemFS) Crash() { m.crash(nil) }

// CrashTorn is Crash except that, per file with unsynced writes, a random
// (seeded, so reproducible) choice is made between losing them all, keeping
// a prefix of them (a torn write), or keeping a prefix whose end reads back
// as zeros (the size reached the disk but the data did not). Zeros only
// appear where the file grew since its last Sync: an unsynced overwrite of
// synced bytes reads back as the old or the new bytes. An unsynced
// shrinking truncation may or may not survive. Directory entries follow
// Crash's rules.
func (m *MemFS) CrashTorn(seed uint64) {
	m.crash(rand.New(rand.NewPCG(seed, 0x5eed)))
}

func (m *MemFS) crash(rng *rand.Rand) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gen++
	// Iterate in a fixed order so a seed always produces the same state.
	dirNames := make([]string, 0, len(m.dirs))
	for name := range m.dirs {
		dirNames = append(dirNames, name)
	}
	slices.Sort(dirNames)
	seen := map[*memInode]bool{}
	for _, dn := range dirNames {
		d := m.dirs[dn]
		d.files = cloneEntries(d.durable)
		names := make([]string, 0, len(d.files))
		for n := range d.files {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			ino := d.files[n]
			if !seen[ino] {
				seen[ino] = true
				ino.crash(rng)
			}
		}
	}
}

func (ino *memInode) crash(rng *rand.Rand) {
	if ino.dirtyLo < 0 {
		return
	}
	out := slices.Clone(ino.synced)
	if out == nil {
		out = []byte{}
	}
	if rng != nil {
		lo := ino.dirtyLo // invariant: lo <= len(synced) and lo <= len(data)
		mode := rng.IntN(3)
		if mode > 0 {
			if len(ino.data) < len(out) && rng.IntN(2) == 0 {
				out = out[:len(ino.data)]
			}
			keep := int64(rng.IntN(int(int64(len(ino.data))-lo) + 1))
			end := lo + keep
			if int64(len(out)) < end {
				out = append(out, make([]byte, end-int64(len(out)))...)
			}
			copy(out[lo:end], ino.data[lo:end])
			if mode == 2 && keep > 0 {
				z := max(lo+int64(rng.IntN(int(keep))), ino.stable)
				if z < end {
					clear(out[z:end])
				}
			}
		}
	}
	ino.data = out
	ino.synced = slices.Clone(out)
	ino.dirtyLo = -1
	ino.stable = int64(len(out))
}

func cloneEntries(src map[string]*memInode) map[string]*memInode {
	dst := make(map[string]*memInode, len(src))
	for k, v := range src {
		dst[k] = v
	}
	return dst
}

func (ino *memInode) markDirty(off int64) {
	if ino.dirtyLo < 0 || off < ino.dirtyLo {
		ino.dirtyLo = off
	}
}

func (ino *memInode) sync() {
	if ino.dirtyLo < 0 {
		return
	}
	lo := min(ino.dirtyLo, int64(len(ino.synced)))
	// append copies data[lo:] into synced's own backing array (or a new one),
	// so synced never aliases data.
	ino.synced = append(ino.synced[:lo], ino.data[lo:]...)
	ino.dirtyLo = -1
	ino.stable = int64(len(ino.data))
}

func (ino *memInode) writeAt(p []byte, off int64) {
	end := off + int64(len(p))
	if old := int64(len(ino.data)); end > old {
		ino.markDirty(min(off, old))
		if end <= int64(cap(ino.data)) {
			ino.data = ino.data[:end]
			clear(ino.data[old:end])
		} else {
			ino.data = append(ino.data, make([]byte, end-old)...)
		}
	}
	ino.markDirty(off)
	copy(ino.data[off:end], p)
}

func (ino *memInode) truncate(size int64) {
	old := int64(len(ino.data))
	switch {
	case size < old:
		ino.data = ino.data[:size]
		ino.markDirty(size)
		ino.stable = min(ino.stable, size)
	case size > old:
		ino.writeAt(make([]byte, size-old), old)
	}
}

// split returns the cleaned directory and base name of name.
func split(name string) (dir, base string) {
	name = filepath.Clean(name)
	return filepath.Dir(name), filepath.Base(name)
}

func pathErr(op, name string, err error) error {
	return &os.PathError{Op: op, Path: name, Err: err}
}

// OpenFile implements FS.
func (m *MemFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	if err := m.checkOp(OpOpen, name); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	dn, base := split(name)
	if _, ok := m.dirs[filepath.Clean(name)]; ok {
		return nil, pathErr("open", name, syscall.EISDIR)
	}
	d, ok := m.dirs[dn]
	if !ok {
		return nil, pathErr("open", name, fs.ErrNotExist)
	}
	writable := flag&(os.O_WRONLY|os.O_RDWR) != 0
	ino := d.files[base]
	switch {
	case ino == nil && flag&os.O_CREATE == 0:
		return nil, pathErr("open", name, fs.ErrNotExist)
	case ino == nil:
		ino = &memInode{dirtyLo: -1, mode: perm.Perm()}
		d.files[base] = ino
	case flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, pathErr("open", name, fs.ErrExist)
	}
	if flag&os.O_TRUNC != 0 && writable {
		ino.truncate(0)
	}
	return &memFile{fs: m, ino: ino, name: name, flag: flag, gen: m.gen}, nil
}

// Remove implements FS.
func (m *MemFS) Remove(name string) error {
	if err := m.checkOp(OpRemove, name); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	clean := filepath.Clean(name)
	if _, ok := m.dirs[clean]; ok {
		if len(m.dirs[clean].files) > 0 || m.hasSubdirs(clean) {
			return pathErr("remove", name, syscall.ENOTEMPTY)
		}
		delete(m.dirs, clean)
		return nil
	}
	dn, base := split(name)
	d, ok := m.dirs[dn]
	if !ok || d.files[base] == nil {
		return pathErr("remove", name, fs.ErrNotExist)
	}
	delete(d.files, base)
	return nil
}

func (m *MemFS) hasSubdirs(dir string) bool {
	for name := range m.dirs {
		if name != dir && filepath.Dir(name) == dir {
			return true
		}
	}
	return false
}

// Rename implements FS. Only files can be renamed.
func (m *MemFS) Rename(oldname, newname string) error {
	if err := m.checkOp(OpRename, oldname); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	od, ob := split(oldname)
	nd, nb := split(newname)
	if _, ok := m.dirs[filepath.Clean(oldname)]; ok {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: syscall.EINVAL}
	}
	src, ok := m.dirs[od]
	if !ok || src.files[ob] == nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: fs.ErrNotExist}
	}
	dst, ok := m.dirs[nd]
	if !ok {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: fs.ErrNotExist}
	}
	if _, ok := m.dirs[filepath.Clean(newname)]; ok {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: syscall.EISDIR}
	}
	ino := src.files[ob]
	delete(src.files, ob)
	dst.files[nb] = ino
	return nil
}

// ReadDir implements FS.
func (m *MemFS) ReadDir(dir string) ([]os.DirEntry, error) {
	if err := m.checkOp(OpReadDir, dir); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	clean := filepath.Clean(dir)
	d, ok := m.dirs[clean]
	if !ok {
		return nil, pathErr("readdir", dir, fs.ErrNotExist)
	}
	var out []os.DirEntry
	for name, ino := range d.files {
		out = append(out, fs.FileInfoToDirEntry(memInfo{name: name, size: int64(len(ino.data)), mode: ino.mode}))
	}
	for name := range m.dirs {
		if name != clean && filepath.Dir(name) == clean {
			out = append(out, fs.FileInfoToDirEntry(memInfo{name: filepath.Base(name), mode: fs.ModeDir | 0o755}))
		}
	}
	slices.SortFunc(out, func(a, b os.DirEntry) int {
		switch {
		case a.Name() < b.Name():
			return -1
		case a.Name() > b.Name():
			return 1
		}
		return 0
	})
	return out, nil
}

// MkdirAll implements FS. Directories are durable as soon as they exist.
func (m *MemFS) MkdirAll(dir string, perm os.FileMode) error {
	if err := m.checkOp(OpMkdirAll, dir); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var missing []string
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		if _, ok := m.dirs[p]; ok {
			break
		}
		pd, pb := split(p)
		if d, ok := m.dirs[pd]; ok && d.files[pb] != nil {
			return pathErr("mkdir", p, syscall.ENOTDIR)
		}
		missing = append(missing, p)
	}
	for _, p := range missing {
		m.dirs[p] = newMemDir()
	}
	return nil
}

// SyncDir implements FS: it makes dir's current entries its durable ones.
func (m *MemFS) SyncDir(dir string) error {
	if err := m.checkSync(OpSyncDir, dir); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.dirs[filepath.Clean(dir)]
	if !ok {
		return pathErr("syncdir", dir, fs.ErrNotExist)
	}
	d.durable = cloneEntries(d.files)
	return nil
}

// Stat implements FS.
func (m *MemFS) Stat(name string) (os.FileInfo, error) {
	if err := m.checkOp(OpStat, name); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	clean := filepath.Clean(name)
	if _, ok := m.dirs[clean]; ok {
		return memInfo{name: filepath.Base(clean), mode: fs.ModeDir | 0o755}, nil
	}
	dn, base := split(name)
	d, ok := m.dirs[dn]
	if !ok || d.files[base] == nil {
		return nil, pathErr("stat", name, fs.ErrNotExist)
	}
	ino := d.files[base]
	return memInfo{name: base, size: int64(len(ino.data)), mode: ino.mode}, nil
}

// memFile is a handle on a memInode. Its methods take the MemFS lock, so
// handles are safe for concurrent use (more than File promises).
type memFile struct {
	fs     *MemFS
	ino    *memInode
	name   string
	flag   int
	gen    uint64
	pos    int64
	closed bool
}

func (f *memFile) checkLocked(op string) error {
	switch {
	case f.closed:
		return pathErr(op, f.name, os.ErrClosed)
	case f.gen != f.fs.gen:
		return pathErr(op, f.name, ErrCrashed)
	}
	return nil
}

func (f *memFile) readable() bool { return f.flag&os.O_WRONLY == 0 }
func (f *memFile) writable() bool { return f.flag&(os.O_WRONLY|os.O_RDWR) != 0 }

func (f *memFile) Name() string { return f.name }

func (f *memFile) Read(p []byte) (int, error) {
	if err := f.fs.checkOp(OpRead, f.name); err != nil {
		return 0, err
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	n, err := f.readAtLocked(p, f.pos)
	f.pos += int64(n)
	return n, err
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.fs.checkOp(OpRead, f.name); err != nil {
		return 0, err
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	n, err := f.readAtLocked(p, off)
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

func (f *memFile) readAtLocked(p []byte, off int64) (int, error) {
	if err := f.checkLocked("read"); err != nil {
		return 0, err
	}
	if !f.readable() {
		return 0, pathErr("read", f.name, syscall.EBADF)
	}
	if off < 0 {
		return 0, pathErr("read", f.name, syscall.EINVAL)
	}
	if off >= int64(len(f.ino.data)) {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	return copy(p, f.ino.data[off:]), nil
}

func (f *memFile) Write(p []byte) (int, error) { return f.write(p, -1) }

// WriteAt implements io.WriterAt. Like *os.File, it refuses a file opened
// with os.O_APPEND.
func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, pathErr("writeat", f.name, syscall.EINVAL)
	}
	if f.flag&os.O_APPEND != 0 {
		return 0, pathErr("writeat", f.name, errWriteAtAppend)
	}
	return f.write(p, off)
}

var errWriteAtAppend = errors.New("invalid use of WriteAt on file opened with O_APPEND")

// write writes p at off, or at the handle's offset (which it advances) if
// off is negative.
func (f *memFile) write(p []byte, at int64) (int, error) {
	op := "write"
	if at >= 0 {
		op = "writeat"
	}
	if err := f.fs.checkOp(OpWrite, f.name); err != nil {
		return 0, err
	}
	f.fs.mu.Lock()
	if err := f.checkLocked(op); err != nil {
		f.fs.mu.Unlock()
		return 0, err
	}
	if !f.writable() {
		f.fs.mu.Unlock()
		return 0, pathErr(op, f.name, syscall.EBADF)
	}
	off := at
	switch {
	case at >= 0:
	case f.flag&os.O_APPEND != 0:
		off = int64(len(f.ino.data))
	default:
		off = f.pos
	}
	hook := f.fs.writeHook
	f.fs.mu.Unlock()

	n, err := len(p), error(nil)
	if hook != nil {
		n, err = hook(f.name, off, p)
		n = max(0, min(n, len(p)))
		if err != nil {
			err = pathErr(op, f.name, err)
		}
	}

	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if cerr := f.checkLocked(op); cerr != nil {
		return 0, cerr
	}
	if at < 0 && f.flag&os.O_APPEND != 0 {
		off = int64(len(f.ino.data))
	}
	f.ino.writeAt(p[:n], off)
	if at < 0 {
		f.pos = off + int64(n)
	}
	return n, err
}

func (f *memFile) Seek(offset int64, whence int) (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkLocked("seek"); err != nil {
		return 0, err
	}
	var pos int64
	switch whence {
	case io.SeekStart:
		pos = offset
	case io.SeekCurrent:
		pos = f.pos + offset
	case io.SeekEnd:
		pos = int64(len(f.ino.data)) + offset
	default:
		return 0, pathErr("seek", f.name, syscall.EINVAL)
	}
	if pos < 0 {
		return 0, pathErr("seek", f.name, syscall.EINVAL)
	}
	f.pos = pos
	return pos, nil
}

func (f *memFile) Sync() error {
	if err := f.fs.checkSync(OpSync, f.name); err != nil {
		return err
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkLocked("sync"); err != nil {
		return err
	}
	f.ino.sync()
	return nil
}

func (f *memFile) Truncate(size int64) error {
	if err := f.fs.checkOp(OpTruncate, f.name); err != nil {
		return err
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkLocked("truncate"); err != nil {
		return err
	}
	if !f.writable() {
		return pathErr("truncate", f.name, syscall.EBADF)
	}
	if size < 0 {
		return pathErr("truncate", f.name, syscall.EINVAL)
	}
	f.ino.truncate(size)
	return nil
}

func (f *memFile) Close() error {
	if err := f.fs.checkOp(OpClose, f.name); err != nil {
		return err
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return pathErr("close", f.name, os.ErrClosed)
	}
	// A stale handle can still be closed: the process "owning" it is gone,
	// but test code tidying up should not have to care.
	f.closed = true
	return nil
}

func (f *memFile) Stat() (os.FileInfo, error) {
	if err := f.fs.checkOp(OpStat, f.name); err != nil {
		return nil, err
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkLocked("stat"); err != nil {
		return nil, err
	}
	return memInfo{name: filepath.Base(f.name), size: int64(len(f.ino.data)), mode: f.ino.mode}, nil
}

type memInfo struct {
	name string
	size int64
	mode os.FileMode
}

func (i memInfo) Name() string       { return i.name }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) Mode() os.FileMode  { return i.mode }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return i.mode.IsDir() }
func (i memInfo) Sys() any           { return nil }
