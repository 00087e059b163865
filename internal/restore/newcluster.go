package restore

import (
	"errors"
	"fmt"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/protobuf/proto"
)

// The first epoch of a new cluster (Options.NewCluster).
//
// A primary opens an epoch whose record changes the contract only once
// enough members of the previous contract have applied the record
// (services/primary, epochChangeWait), so that every promotion quorum of
// the previous contract holds a node that knows the new one. A restored
// directory's state holds the old cluster's epoch record: started as the
// primary of a new cluster whose data nodes are not the old ones (no
// replicas, or new ids), it waited for the old cluster's members, which
// never come.
//
// With NewCluster the restore writes the new cluster's first epoch
// itself: after the state at the target (whose digest is the source's),
// one batch at the next LSNs, of an epoch after every one of the lineage,
// that puts an epoch record naming the new cluster's primary and
// contract; the snapshot is taken after it. The new primary then finds
// its own cluster's contract as the previous one: the same (no wait), or
// a change waited for under the new cluster's members, as any.
//
// Why nothing is lost by not waiting for the old contract's members: only
// a node of the new cluster can take part in one of its promotions — its
// id is new (the restore's), and every node refuses another cluster's
// fences, streams and snapshots, and a promotion counts no answer of
// another cluster (docs/ARCHITECTURE.md, Cluster identity). Every node of
// the new cluster starts empty and gets its state from the new primary,
// or from the new log stores, which hold only what that primary shipped
// and uploaded: snapshots at or after this batch (the primary's own, and
// the one it recovered from, which is this one's) and the batches after
// them. So every state a node of the new cluster applies holds this record
// or a later one of the new cluster, and no node of it ever judges under
// the old contract: it has no promotion quorum to meet. The batch that
// ends at the target (tail.go), which the WAL keeps and the new log
// stores get, is below every such snapshot: no node applies it, nor holds
// it in its log past its applied state. Without NewCluster the old
// contract stays the previous one, and its members (the old ids, reused)
// must apply the first record, as docs/RUNBOOK.md said until this.

// NewCluster is the first epoch of the cluster a restored directory
// starts, written by the restore.
type NewCluster struct {
	// Primary is the id of the new cluster's primary: one of the
	// contract's members, whose address the record gives.
	Primary string
	// Contract is the new cluster's: its members, log stores, k and log
	// store sync (as services/primary ContractOf makes it from the
	// primary's flags).
	Contract *walshipv1.Contract
}

// validate checks nc, naming walship restore's flags.
func (nc *NewCluster) validate() error {
	c := nc.Contract
	if c == nil || len(c.GetMembers()) == 0 {
		return errors.New("--members: the new cluster needs at least its primary")
	}
	seen := map[string]bool{}
	for _, m := range c.GetMembers() {
		switch {
		case datadir.ValidateNodeID(m.GetId()) != nil:
			return fmt.Errorf("--members: %v", datadir.ValidateNodeID(m.GetId()))
		case m.GetId() == "." || m.GetId() == "..":
			return fmt.Errorf("--members: %q is not a node id (a directory's name)", m.GetId())
		case m.GetAddr() == "":
			return fmt.Errorf("--members: %s has no address (id=host:port)", m.GetId())
		case seen[m.GetId()]:
			return fmt.Errorf("--members: %s is named twice", m.GetId())
		}
		seen[m.GetId()] = true
	}
	if !seen[nc.Primary] {
		return fmt.Errorf("--members: the primary %q is not a member", nc.Primary)
	}
	if k := int(c.GetSyncReplicas()); k > len(c.GetMembers())-1 {
		return fmt.Errorf("--sync-replicas: %d, but --members names %d data node(s) besides the primary", k, len(c.GetMembers())-1)
	}
	if c.GetLogstoreSync() && len(c.GetLogstores()) == 0 {
		return errors.New("--logstore-ack sync: needs the new cluster's log stores (--new-logstore)")
	}
	return nil
}

// beginCluster builds the new cluster's first epoch after the restored
// state at res.LSN: its epoch record's batch (r.first), applied to the
// state, and the lineage with the epoch (r.newLineage).
func (r *restorer) beginCluster(res *Result) error {
	nc := r.o.NewCluster
	epoch, err := datadir.NextEpoch(res.Lineage.Current().Epoch)
	if err != nil {
		return fmt.Errorf("the new cluster's first epoch: %w", err)
	}
	first := res.LSN + 1
	h := res.Lineage.With(epoch, first)
	var addr string
	for _, m := range nc.Contract.GetMembers() {
		if m.GetId() == nc.Primary {
			addr = m.GetAddr()
		}
	}
	now := time.Now()
	rec, err := proto.Marshal(&walshipv1.EpochRecord{Epoch: epoch, FirstLsn: first, PrimaryId: nc.Primary, PrimaryAddr: addr,
		Contract: nc.Contract, TimeUnixNano: now.UnixNano(), History: h.Proto()})
	if err != nil {
		return fmt.Errorf("the new cluster's epoch record: %w", err)
	}
	// One transaction: the put, then its commit (txn ids need only be
	// unique and increasing along the log: the primary's next is the
	// applied LSN + 1).
	b := codec.Batch{Records: []codec.Record{
		{LSN: first, TxnID: first, Op: codec.OpPut, Key: []byte(keyspace.EpochRecordKey), Value: rec},
		{LSN: first + 1, TxnID: first, Op: codec.OpCommit},
	}}
	payload, err := codec.MsgPack.AppendBatch(nil, &b)
	if err != nil {
		return fmt.Errorf("the new cluster's epoch record: %w", err)
	}
	env := &walshipv1.WalBatch{Epoch: epoch, FirstLsn: first, LastLsn: first + 1, PrevLsn: first - 1, CommitTimeUnixNano: now.UnixNano(),
		Codec: walshipv1.Codec(codec.MsgPack.ID()), Payload: payload, Crc32C: codec.Checksum(payload)}
	if err := envelope.Verify(env); err != nil {
		return fmt.Errorf("the new cluster's epoch record: %w", err)
	}
	if err := r.store.Apply(&b); err != nil {
		return fmt.Errorf("the new cluster's epoch record: %w", err)
	}
	r.first, r.newLineage = env, h
	res.NewEpoch, res.NewEpochLSN = epoch, first+1
	return nil
}
