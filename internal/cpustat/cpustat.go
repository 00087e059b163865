// Package cpustat reads a process's CPU time, for benchmarks that report
// CPU per operation next to their throughput.
package cpustat

import (
	"syscall"
	"time"
)

// Self returns this process's user+system CPU time so far.
func Self() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// MustSelf is Self for callers with nowhere to send an error (benchmarks):
// getrusage(RUSAGE_SELF) fails only for a bad pointer, so an error here is
// a bug and panics.
func MustSelf() time.Duration {
	d, err := Self()
	if err != nil {
		panic("cpustat: " + err.Error())
	}
	return d
}
