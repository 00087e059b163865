// Package failover is the failover protocol's deterministic core: the
// rules every party applies, with no goroutines, no I/O and no clock
// (etcd-io/raft's shape). The services carry out what it decides.
//
//   - acceptor.go: the acceptor — a log store or a replica — answering a
//     candidate's fence, a primary's heartbeats and batches, entries that
//     come without their primary (catch-up) and a truncate. Each handler
//     takes the acceptor's State and a message and returns a Step: a
//     refusal, or the effects to persist, in order, before the answer is
//     sent, and the State once they are.
//   - quorum.go: the quorum rules — a commit acknowledged by k replicas at
//     a level, a log store majority, a promotion's N−k+1 — in one place,
//     with the proof (a test over every N ≤ 7) that every promotion quorum
//     meets every ack quorum; and the joint rules of a membership change
//     (JointAckLSN, JudgeJoint, Config, ValidChange), with the proof (a
//     test over every pair of configurations of up to 5 voters) that every
//     joint promotion quorum meets every ack quorum of the old, joint and
//     new contracts.
//   - donor.go: the one check of a batch copied from a donor (a log store
//     or a replica's log), used by a replica's catch-up and a candidate's
//     copy alike.
//   - node.go: a data node's run loop as named states and a transition
//     function.
//
// The numbers in comments (I1, I2, …) are those of docs/ARCHITECTURE.md,
// "Failover invariants"; testdata/*.txt are the transcripts that show them.
package failover
