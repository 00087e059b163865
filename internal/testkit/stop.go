package testkit

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// ThreadsStopped reports whether every thread of pid is stopped (state T,
// or t under a tracer), from /proc/pid/task/*/stat; a thread that ends
// while it looks is skipped. A zombie thread is an error: the process is
// exiting, not stopping.
//
// A test that stops a process (SIGSTOP) to stand for a machine that went
// silent waits for this before it relies on the silence: the kernel stops
// a process thread by thread, and on a loaded machine a thread still
// running can take a request sent after kill(2) returned — and answer it.
func ThreadsStopped(pid int) (bool, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false, err
	}
	seen := 0
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // the thread ended
		}
		if err != nil {
			return false, err
		}
		seen++
		// "tid (comm) S ...": the state follows the last ')'.
		f := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])
		if len(f) == 0 {
			return false, fmt.Errorf("thread %s: no state in %q", task.Name(), b)
		}
		switch string(f[0]) {
		case "T", "t":
		case "Z", "X":
			return false, fmt.Errorf("thread %s is exiting (state %s)", task.Name(), f[0])
		default:
			return false, nil
		}
	}
	return seen > 0, nil
}
