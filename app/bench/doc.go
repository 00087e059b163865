// Package bench is walship's load generator: `walship bench`.
//
// It runs closed-loop client transactions over the public KV API against a
// cluster it starts itself (in this process, or as separate `walship`
// processes) or against an existing one, and reports the NoisePage seed's
// table (Replication | Durability | Reqs per second) with latency, retries,
// replica lag and WAL throughput per row.
//
// Every workload transaction is optimistic: it reads what it needs (a
// read-only Txn of gets on the primary, or Gets with min_lsn on a replica),
// computes its writes, then commits them in one Txn whose compares assert
// the version_lsn of every key it read (and version 0 for every key it
// inserts). When a compare fails, the Txn's failure branch returns fresh
// values of the keys read, and the transaction runs again from those — one
// round trip per retry. After MaxRetries failed attempts it aborts.
//
// After each run, the workload's consistency conditions (TPC-C's, TPC-B's
// balance sums, YCSB's update counters) are checked on a full scan of the
// primary and of every replica at the run's last LSN, and the nodes' state
// digests are compared.
package bench
