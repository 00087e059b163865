// Package grpcfuzz fuzzes every method of every walship server over real
// gRPC: an in-process cluster (a log store, a primary and a replica
// following it, members of one cluster) served over mTLS under the
// default authorization policy, as `walship dev --tls` serves it, driven
// by callers holding each class of certificate the cluster's CA issues
// (node, log store, client, admin, one with no identity, an admin of
// another trust domain).
//
// The methods are the ones the servers' reflection lists, health and
// reflection included, so a method added later is driven without a
// change here (TestGRPCSeeded fails until it has a valid seed request).
// Requests are valid seeds mutated by Mutator: schema-aware (extreme and
// live integers, empty, huge and odd strings and bytes, huge repeated
// fields, another member of a oneof) and on the wire (invalid UTF-8 in a
// string field, unknown fields, wrong wire types, truncation, noise).
// Streams get sequences of them, with or without a half-close, and
// cancels.
//
// After every call the harness checks the status code (never UNKNOWN or
// INTERNAL; DATA_LOSS only where the request carried corrupt data;
// PERMISSION_DENIED for every class the policy refuses), that responses
// decode, and that the call made the process allocate no more than a
// bound proportional to what went over the wire. After every batch: every
// server serving, a well-behaved Put read back on the other data node and
// equal digests, no log-store entries cut without a change of primary, a
// well-behaved switchover still possible after a call moved the primary,
// and the heap back near its baseline.
//
// FuzzGRPC is the fuzz target (make fuzz runs it); TestGRPCSeeded is a
// bounded, deterministic run for every `go test`. Each finding comes with
// its reproducer: server, class, method, the messages sent, and a corpus
// file for FuzzGRPC that replays it.
package grpcfuzz
