package client_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The client starts a goroutine of its own (the TLS files' reload): it
// and every connection must be gone after Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
