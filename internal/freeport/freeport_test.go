package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestPick: each address is on the host asked for, below the ephemeral
// range (so no outgoing connection takes it), free (a listener binds it),
// and not one handed out before in this process.
func TestPick(t *testing.T) {
	seen := map[string]bool{}
	for range 20 {
		addr, err := Pick("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("%q: not 127.0.0.1:port", addr)
		}
		if low := EphemeralLow(); Room(low) && (p < Low || p >= low) {
			t.Fatalf("%q: port not in [%d, %d)", addr, Low, low)
		}
		if seen[addr] {
			t.Fatalf("%q handed out twice", addr)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%q is not free: %v", addr, err)
		}
		l.Close()
		seen[addr] = true
	}
}
