// Package e2e tests the real walship binary as users run it: separate
// processes on loopback, killed with SIGKILL, stopped with SIGSTOP, and
// driven with the real grpcurl. The tests use $WALSHIP_BIN and
// $WALSHIP_GRPCURL when set (make test sets both) and otherwise build what
// they need with the go tool.
package e2e
