package bench

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Placements of a started cluster's nodes (`walship bench --placement`).
const (
	// PlacementShared runs every node and the clients on the same cores,
	// in this process or as processes.
	PlacementShared = "shared"
	// PlacementSeparate runs the primary and its clients on one half of
	// the CPUs this process may use, the log store and the replicas on the
	// other, each as a process of its own: as on separate hosts, as far as
	// one machine goes (they still share its memory bus, caches and disk).
	PlacementSeparate = "separate"
)

// SplitCPUs splits the CPUs this process may run on in two: the first
// half for the primary and its clients, the rest for the log store and the
// replicas, each as a taskset list. It fails with fewer than two CPUs.
func SplitCPUs() (primaryCPUs, peerCPUs string, err error) {
	cpus, err := allowedCPUs()
	if err != nil {
		return "", "", err
	}
	if len(cpus) < 2 {
		return "", "", fmt.Errorf("this process may use %d CPU(s); placing the nodes apart needs two", len(cpus))
	}
	half := len(cpus) / 2
	return cpuListOf(cpus[:half]), cpuListOf(cpus[half:]), nil
}

// allowedCPUs lists, ascending, the CPUs this process may run on.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("CPUs this process may use: %w", err)
	}
	var cpus []int
	for i := 0; i < len(set)*64; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus, nil
}

// cpuListOf writes cpus (ascending) as a taskset list, ranges folded.
func cpuListOf(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// parseCPUList reads a taskset list such as 0,2-3.
func parseCPUList(list string) (unix.CPUSet, error) {
	var set unix.CPUSet
	if !cpuList.MatchString(list) {
		return set, fmt.Errorf("%q is not a CPU list such as 1 or 0,2-3", list)
	}
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || b < a || b >= len(set)*64 {
			return set, fmt.Errorf("%q: %q is not a CPU or an ascending range of them", list, part)
		}
		for c := a; c <= b; c++ {
			set.Set(c)
		}
	}
	return set, nil
}

// PinSelf lets every thread of this process run only on the CPUs of list,
// as `taskset -a -p` does: the clients of a separate placement. Threads
// started later inherit it from the thread that starts them, so it loops
// until a pass over /proc/self/task finds no thread it has not pinned.
func PinSelf(list string) error {
	set, err := parseCPUList(list)
	if err != nil {
		return err
	}
	pinned := map[int]bool{}
	for {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("threads of this process: %w", err)
		}
		more := false
		for _, task := range tasks {
			tid, err := strconv.Atoi(task.Name())
			if err != nil || pinned[tid] {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("pin thread %d to CPUs %s: %w", tid, list, err)
			}
			pinned[tid], more = true, true
		}
		if !more {
			return nil
		}
	}
}
