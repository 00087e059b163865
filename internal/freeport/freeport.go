// Package freeport picks a TCP port for a server that will bind it later
// — and may bind it again after a restart — outside the kernel's
// ephemeral range. A port from "host:0" comes from that range, where any
// outgoing connection on the machine may take it as its local port in
// the meantime; the server's bind then fails with "address already in
// use". No connect(2) takes a port below the range.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Low is the bottom of the range ports are picked from.
const Low = 10000

// handedOut are the addresses Pick returned in this process: a caller
// that picks several before it binds any gets distinct ones.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// Pick returns host:port with a port nothing listened on a moment ago,
// in [Low, the first ephemeral port), never one it returned before in
// this process. With too little room below the ephemeral range it takes
// any free port.
func Pick(host string) (string, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	high := EphemeralLow()
	if !Room(high) {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return "", err
		}
		defer l.Close()
		return l.Addr().String(), nil
	}
	var errs []error
	for range 50 {
		addr := net.JoinHostPort(host, strconv.Itoa(Low+rand.IntN(high-Low)))
		if handedOut.addrs[addr] {
			continue
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := l.Close(); err != nil {
			return "", err
		}
		handedOut.addrs[addr] = true
		return addr, nil
	}
	return "", fmt.Errorf("no free port on %s in [%d, %d) after 50 tries: %w", host, Low, high, errors.Join(errs...))
}

// Room reports whether there is room enough below an ephemeral range
// starting at high to pick ports from.
func Room(high int) bool { return high-Low >= 1000 }

// EphemeralLow is the first port of the kernel's ephemeral range (Linux's
// ip_local_port_range; 32768, its default, elsewhere or if unreadable).
func EphemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}
