package realkube

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// dialTrace records what a client's connection to a Service did: each TCP
// connect (its local port, the pod kube-proxy translated it to, as
// conntrack has it, how long it took and how it ended), the channel's
// connectivity states, and its calls' failures (runs of the same error
// counted, not listed) and slow calls. It is for the timelines: where a
// client's gap goes between a pod and the Service's rules; nothing asserts
// on it.
type dialTrace struct {
	mu     sync.Mutex
	events []tlEvent
	dials  int
	// podOf maps a connect's local port to the pod address it reached.
	podOf map[int]string
	// lastErr is the error of the last failed call, and failed how many
	// calls in a row failed with it.
	lastErr string
	failed  int
}

func newDialTrace() *dialTrace { return &dialTrace{podOf: map[int]string{}} }

func (d *dialTrace) add(at time.Time, format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.events = append(d.events, tlEvent{at, fmt.Sprintf(format, args...)})
}

// dial is a grpc.WithContextDialer dialer: a plain TCP connect whose
// socket is bound first, so that its local port, and from it conntrack's
// translation, is known even when the connect fails.
func (d *dialTrace) dial(ctx context.Context, addr string) (net.Conn, error) {
	var port int
	nd := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			if err = syscall.Bind(int(fd), &syscall.SockaddrInet4{}); err != nil {
				return
			}
			var sa syscall.Sockaddr
			if sa, err = syscall.Getsockname(int(fd)); err == nil {
				if in4, ok := sa.(*syscall.SockaddrInet4); ok {
					port = in4.Port
				}
			}
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	d.mu.Lock()
	d.dials++
	n := d.dials
	d.mu.Unlock()
	start := time.Now()
	conn, err := nd.DialContext(ctx, "tcp", addr)
	took := time.Since(start)
	to := conntrackReplySource(port)
	d.mu.Lock()
	d.podOf[port] = to
	d.mu.Unlock()
	result := "connected"
	if err != nil {
		result = err.Error()
	}
	d.add(start, "client: dial #%d from :%d to %s → pod %s (conntrack): %s after %v", n, port, addr, to, result, took.Round(100*time.Microsecond))
	return conn, err
}

// conntrackReplySource returns the source of the reply direction of the
// host's conntrack entry for a TCP connection from local port: the pod
// that kube-proxy's DNAT chose, "?" if none is found.
func conntrackReplySource(port int) string {
	if port == 0 {
		return "?"
	}
	out, err := exec.Command("conntrack", "-L", "-p", "tcp", "--orig-port-src", strconv.Itoa(port)).Output()
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(out), "\n") {
		// tcp 6 119 SYN_SENT src=A dst=SVC sport=P dport=7401 [UNREPLIED] src=POD dst=A ...
		f := strings.Fields(line)
		var srcs []string
		state := ""
		for i, w := range f {
			if v, ok := strings.CutPrefix(w, "src="); ok {
				srcs = append(srcs, v)
			}
			if i == 3 && !strings.Contains(w, "=") {
				state = w
			}
		}
		if len(srcs) == 2 {
			return srcs[1] + " " + state
		}
	}
	return "?"
}

// watchStates records the channel's connectivity states until ctx ends.
func (d *dialTrace) watchStates(ctx context.Context, conn *grpc.ClientConn) {
	st := conn.GetState()
	d.add(time.Now(), "client: channel %s", st)
	for conn.WaitForStateChange(ctx, st) {
		st = conn.GetState()
		d.add(time.Now(), "client: channel %s", st)
		if st == connectivity.Shutdown {
			return
		}
	}
}

// intercept is a unary interceptor: it records the first of a run of
// calls that fail with the same error and how many there were, the first
// success after failures with the pod that answered it, and calls that
// took longer than 200 ms.
func (d *dialTrace) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var p peer.Peer
	start := time.Now()
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
	took := time.Since(start)
	name := method[strings.LastIndexByte(method, '/')+1:]
	d.mu.Lock()
	defer d.mu.Unlock()
	pod := "?"
	if a, ok := p.LocalAddr.(*net.TCPAddr); ok {
		if v, ok := d.podOf[a.Port]; ok {
			pod = fmt.Sprintf("%s via :%d", v, a.Port)
		}
	}
	if err != nil {
		msg := status.Code(err).String() + ": " + status.Convert(err).Message()
		if len(msg) > 160 {
			msg = msg[:160] + "…"
		}
		if msg != d.lastErr {
			if d.failed > 1 {
				d.events = append(d.events, tlEvent{start, fmt.Sprintf("client: (%d calls in all failed with the error before)", d.failed)})
			}
			d.events = append(d.events, tlEvent{start, fmt.Sprintf("client: %s failed after %v from %s: %s", name, took.Round(time.Millisecond), pod, msg)})
			d.lastErr, d.failed = msg, 0
		}
		d.failed++
		return err
	}
	if d.failed > 0 {
		d.events = append(d.events, tlEvent{start.Add(took), fmt.Sprintf("client: %s answered by %s after %v, after %d failed calls", name, pod, took.Round(time.Millisecond), d.failed)})
		d.lastErr, d.failed = "", 0
	} else if took > 200*time.Millisecond {
		d.events = append(d.events, tlEvent{start.Add(took), fmt.Sprintf("client: %s answered by %s after %v (slow)", name, pod, took.Round(time.Millisecond))})
	}
	return nil
}

// since returns the events at or after from.
func (d *dialTrace) since(from time.Time) []tlEvent {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []tlEvent
	for _, e := range d.events {
		if !e.at.Before(from) {
			out = append(out, e)
		}
	}
	return out
}
