package testkit

import (
	"testing"

	"github.com/walship/walship/internal/freeport"
)

// FreeAddr returns a loopback address (127.0.0.1:port) that nothing
// listened on a moment ago, for a process or server the test starts on it
// later — and may restart on it after killing it: freeport.Pick's, below
// the ephemeral range, where no outgoing connection can take the port
// meanwhile (one from "127.0.0.1:0" can be, and a node restarted on it
// then fails with "address already in use").
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	addr, err := freeport.Pick("127.0.0.1")
	if err != nil {
		tb.Fatal(err)
	}
	return addr
}
