// Package hostile attacks real walship processes as a peer holding one
// certificate of the cluster's CA might (issue 33): requests sent but for
// their last byte, streams opened and never sent on, many connections,
// answers never read, huge scans, amplifying transactions, thousands of
// reads waiting for an LSN far ahead — each for a bounded time while a
// well-behaved client commits. TestHostileClients asserts what must hold
// whatever the load of the machine: the attacked server's RSS stays
// within 256 MiB of its baseline, no server exits, and the well-behaved
// client reads no wrong answer. BenchmarkWellBehavedClient measures that
// client's commits/s under each attack; the target is half of what it
// has without one.
//
// The tests use $WALSHIP_BIN when set, else build walship once; each
// attack runs a few seconds, or $WALSHIP_HOSTILE_SECONDS.
package hostile
