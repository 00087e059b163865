package bench

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walship/walship/internal/cpustat"
)

// loopbackReaderEnv makes the test binary a loopback reader
// (loopbackReader) instead of running tests.
const loopbackReaderEnv = "WALSHIP_LOOPBACK_READER"

// loopbackReader listens on loopback, prints its address, and reads one
// connection until it ends: the peer of BenchmarkLoopbackMessage, in a
// process of its own as a replica is.
func loopbackReader() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(ln.Addr())
	c, err := ln.Accept()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, _ = io.Copy(io.Discard, c)
	return 0
}

// BenchmarkLoopbackMessage measures what one 1 KiB message to a peer
// process costs the sender's CPU on this machine, the unit of the
// primary's replication cost: a write on a loopback TCP connection, to a
// reader pinned to the sender's CPU or to another, paced at one message a
// millisecond (the reader sleeps between messages, as a replica does at
// moderate load) or back to back. On loopback the writer's system call
// also runs the reader's TCP receive path and wakes it, work that across
// hosts falls to the NIC and the receiver. paced/none is the pacing
// alone (the loop without the write), to subtract from the paced cases.
//
//	go test -run '^$' -bench BenchmarkLoopbackMessage -benchtime 3000x ./app/bench
func BenchmarkLoopbackMessage(b *testing.B) {
	if runtime.GOOS != "linux" || runtime.NumCPU() < 2 {
		b.Skip("needs Linux and two CPUs (pins the sender and the reader)")
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		b.Skip("needs taskset (util-linux) to pin the reader")
	}
	cpus, err := allowedCPUs()
	if err != nil {
		b.Fatal(err)
	}
	if len(cpus) < 2 {
		b.Skip("this process may use one CPU")
	}
	if err := PinSelf(fmt.Sprint(cpus[0])); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := PinSelf(cpuListOf(cpus)); err != nil {
			b.Errorf("unpin this process (benchmarks after this one would run on CPU %d alone): %v", cpus[0], err)
		}
	})
	for _, paced := range []bool{true, false} {
		mode := "back-to-back"
		if paced {
			mode = "paced"
			b.Run(mode+"/none", func(b *testing.B) { loopbackSend(b, "", true) })
		}
		for _, at := range []struct {
			name string
			cpu  int
		}{{"same-cpu", cpus[0]}, {"other-cpu", cpus[1]}} {
			b.Run(mode+"/"+at.name, func(b *testing.B) { loopbackSend(b, fmt.Sprint(at.cpu), paced) })
		}
	}
}

// loopbackSend writes b.N messages to a reader pinned to readerCPU (none
// for ""), paced or not, and reports the sender's CPU per message.
func loopbackSend(b *testing.B, readerCPU string, paced bool) {
	var conn net.Conn
	if readerCPU != "" {
		cmd := exec.Command("taskset", "-c", readerCPU, os.Args[0])
		cmd.Env = append(os.Environ(), loopbackReaderEnv+"=1")
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { _ = cmd.Wait() }()
		addr, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			_ = cmd.Process.Kill()
			b.Fatalf("reader's address: %v", err)
		}
		if conn, err = net.Dial("tcp", strings.TrimSpace(addr)); err != nil {
			_ = cmd.Process.Kill()
			b.Fatal(err)
		}
		defer conn.Close()
	}
	msg := make([]byte, 1024)
	b.ResetTimer()
	before := cpustat.MustSelf()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if conn != nil {
			if _, err := conn.Write(msg); err != nil {
				b.Fatal(err)
			}
		}
		if paced {
			time.Sleep(time.Until(start.Add(time.Duration(i+1) * time.Millisecond)))
		}
	}
	used := cpustat.MustSelf() - before
	b.StopTimer()
	b.ReportMetric(float64(used.Nanoseconds())/1e3/float64(b.N), "cpu-µs/msg")
}

// BenchmarkLookupsAfterSyscall measures what a system call costs the user
// code that runs after it on this machine: random lookups in a map too big
// for the caches (as the primary's state tree is), timed in groups of 10,
// with 0, 1 or 4 cheap system calls (getppid) before each group, outside
// the timed part. ns/lookup rises with the calls where entering the kernel
// flushes the TLB or the caches (some virtual machines' kernels run in an
// address space of their own); on hardware that keeps them it barely
// moves. On such a machine every message replication adds slows the
// primary's commit path too, not only by the call's own time.
//
//	go test -run '^$' -bench BenchmarkLookupsAfterSyscall -count 3 ./app/bench
func BenchmarkLookupsAfterSyscall(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("uses getppid(2) through package syscall on Linux")
	}
	const keys = 1 << 20
	m := make(map[int]int, keys)
	for i := range keys {
		m[i*7919] = i
	}
	probe := make([]int, 1<<16)
	state := uint64(1)
	for i := range probe {
		state = state*6364136223846793005 + 1442695040888963407
		probe[i] = int(state>>33) % keys * 7919
	}
	for _, calls := range []int{0, 1, 4} {
		b.Run(fmt.Sprintf("syscalls=%d", calls), func(b *testing.B) {
			var timed time.Duration
			sum, n := 0, 0
			for i := 0; i < b.N; i++ {
				for range calls {
					syscall.Getppid()
				}
				start := time.Now()
				for j := range 10 {
					sum += m[probe[(n+j)&(len(probe)-1)]]
				}
				timed += time.Since(start)
				n += 10
			}
			if sum < 0 {
				b.Fatal("impossible sum") // keeps the lookups
			}
			b.ReportMetric(float64(timed.Nanoseconds())/float64(n), "ns/lookup")
		})
	}
}
