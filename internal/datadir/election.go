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

// Election is a log store's election register (failover.Register says
// what it means and how it changes).
type Election struct {
	// Holder is the node id of the holder ("" never held).
	Holder string
	// Term is the holder's term; every grant raises it.
	Term uint64
	// PauseVersion numbers the operator's pauses and resumes; Paused is
	// the state as of that version.
	PauseVersion uint64
	Paused       bool
}

// electionFile holds a log store's election register (Election),
// one line: "term holder pause_version paused", holder "-" when never held,
// paused 0 or 1. A missing file is a register never held.
const electionFile = "election"

// LoadElection reads dir's election register.
func LoadElection(fsys vfs.FS, dir string) (Election, error) {
	b, err := vfs.ReadFile(fsys, filepath.Join(dir, electionFile))
	if errors.Is(err, os.ErrNotExist) {
		return Election{}, nil
	}
	if err != nil {
		return Election{}, fmt.Errorf("read election register: %w", err)
	}
	r, err := ParseElection(b)
	if err != nil {
		return Election{}, fmt.Errorf("election file %s: %w", filepath.Join(dir, electionFile), err)
	}
	return r, nil
}

// ParseElection decodes an election file's contents.
func ParseElection(b []byte) (Election, error) {
	f := strings.Fields(string(b))
	bad := fmt.Errorf("holds %q: want \"term holder pause_version paused\"", b)
	if len(f) != 4 {
		return Election{}, bad
	}
	var r Election
	var err1, err2 error
	r.Term, err1 = strconv.ParseUint(f[0], 10, 64)
	r.Holder = unquote(f[1])
	r.PauseVersion, err2 = strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil || (f[3] != "0" && f[3] != "1") || len(r.Holder) > 64 {
		return Election{}, bad
	}
	r.Paused = f[3] == "1"
	return r, nil
}

// SaveElection durably replaces dir's election register.
func SaveElection(fsys vfs.FS, dir string, r Election) error {
	paused := 0
	if r.Paused {
		paused = 1
	}
	line := fmt.Sprintf("%d %s %d %d\n", r.Term, quote(r.Holder), r.PauseVersion, paused)
	if err := vfs.WriteFileAtomic(fsys, filepath.Join(dir, electionFile), []byte(line)); err != nil {
		return fmt.Errorf("save election register %+v: %w", r, err)
	}
	return nil
}
