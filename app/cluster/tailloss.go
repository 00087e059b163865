package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/services/primary"
)

// TailLossConfig is the contract TailLoss needs: every commit waits for
// one replica's flush (k = 1 of the two replicas), not for the log store,
// and a lease long enough for the tail to be written after the log store
// stopped. Use it as Config.Primary with Failover, one log store and two
// replicas.
func TailLossConfig(p *primary.Config) {
	p.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC
	p.Policy.SyncReplicas = 1
	p.Policy.SyncLevel = walshipv1.SyncLevel_SYNC_LEVEL_FLUSH
	p.Policy.LogStore = walshipv1.LogStoreAck_LOG_STORE_ACK_ASYNC
	p.LeaseTimeout = 3 * time.Second
}

// Commit is one acknowledged write of TailLoss.
type Commit struct {
	Key   string
	Value string
	LSN   uint64
}

// TailLoss is what TailLoss did.
type TailLoss struct {
	// Kept were acknowledged while every node was up: a log store and
	// both replicas hold them.
	Kept []Commit
	// Tail were acknowledged by replica-0 alone (the contract's k = 1),
	// while replica-1 and the log store were down.
	Tail []Commit
	// DryRun is replica-1's promotion dry run once the primary and
	// replica-0 are down and the log store and replica-1 back.
	DryRun *walshipv1.PromoteResponse
	// Promoted is its forced promotion.
	Promoted *walshipv1.PromoteResponse
	// Orphans are the orphan files replica-0 cut once it came back and
	// rejoined replica-1, the new primary.
	Orphans []datadir.Orphan
	// OrphanDir is replica-0's data directory, where they are.
	OrphanDir string
}

// TailLoss stages the loss a forced promotion causes, on a cluster
// started with Failover, one log store, two replicas and TailLossConfig
// (StageTailLoss), then promotes replica-1 by force and has replica-0
// rejoin (FinishTailLoss): replica-1's promotion lacks a quorum and is
// forced; replica-0, restarted, rejoins the new primary and cuts the tail
// into an orphan file, and the new primary opens (its epoch record needs
// replica-0's flush under the contract). kept and tail name the keys
// written before and during the outage. The returned loss says what was
// acknowledged, what the dry run said and where the orphans are.
func (c *Cluster) TailLoss(ctx context.Context, kept, tail []string) (*TailLoss, error) {
	out, err := c.StageTailLoss(ctx, kept, tail)
	if err != nil {
		return nil, err
	}
	admin := walshipv1.NewAdminServiceClient(c.Conn(c.Replicas[1]))
	if out.DryRun, err = admin.Promote(ctx, &walshipv1.PromoteRequest{DryRun: true}); err != nil {
		return nil, fmt.Errorf("tail loss: dry run: %w", err)
	}
	if out.Promoted, err = admin.Promote(ctx, &walshipv1.PromoteRequest{Force: true}); err != nil {
		return nil, fmt.Errorf("tail loss: forced promotion: %w", err)
	}
	return out, c.FinishTailLoss(ctx, out)
}

// StageTailLoss writes the kept commits, then — replica-1 and the log
// store down — the tail, acknowledged by replica-0 alone under the
// contract (k = 1); then stops the primary and replica-0, the tail's only
// holders, and brings the log store and replica-1 back: replica-1 is the
// survivor a promotion would start from, and nothing that answers holds
// the tail.
func (c *Cluster) StageTailLoss(ctx context.Context, kept, tail []string) (*TailLoss, error) {
	if !c.cfg.Failover || len(c.LogStores) != 1 || len(c.Replicas) != 2 || len(kept) == 0 {
		return nil, errors.New("tail loss: needs Failover, one log store, two replicas and a kept key")
	}
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	put := func(k, v string) (Commit, error) {
		r, err := kv.Put(ctx, &walshipv1.PutRequest{Key: k, Value: []byte(v)})
		if err != nil {
			return Commit{}, fmt.Errorf("tail loss: put %s: %w", k, err)
		}
		return Commit{Key: k, Value: v, LSN: r.GetLsn()}, nil
	}
	out := &TailLoss{OrphanDir: filepath.Join(c.cfg.Dir, c.Replicas[0].Name)}
	for _, k := range kept {
		cm, err := put(k, "kept-"+k)
		if err != nil {
			return nil, err
		}
		out.Kept = append(out.Kept, cm)
	}
	// Every node has the kept commits once replica-1 has applied the last.
	last := out.Kept[len(out.Kept)-1].LSN
	r1 := walshipv1.NewKVServiceClient(c.Conn(c.Replicas[1]))
	if _, err := r1.Get(ctx, &walshipv1.GetRequest{Key: kept[0], MinLsn: last}); err != nil {
		return nil, fmt.Errorf("tail loss: replica-1 applying LSN %d: %w", last, err)
	}
	if err := c.StopReplica(1); err != nil {
		return nil, fmt.Errorf("tail loss: stop replica-1: %w", err)
	}
	if err := c.StopNode(c.LogStores[0]); err != nil {
		return nil, fmt.Errorf("tail loss: stop the log store: %w", err)
	}
	// The primary answers for up to a lease without its log store.
	for _, k := range tail {
		cm, err := put(k, "tail-"+k)
		if err != nil {
			return nil, err
		}
		out.Tail = append(out.Tail, cm)
	}
	if err := c.StopNode(c.Primary); err != nil {
		return nil, fmt.Errorf("tail loss: stop the primary: %w", err)
	}
	if err := c.StopReplica(0); err != nil {
		return nil, fmt.Errorf("tail loss: stop replica-0: %w", err)
	}
	if err := c.RestartLogStore(ctx, 0); err != nil {
		return nil, fmt.Errorf("tail loss: restart the log store: %w", err)
	}
	if err := c.RestartReplica(ctx, 1); err != nil {
		return nil, fmt.Errorf("tail loss: restart replica-1: %w", err)
	}
	return out, nil
}

// FinishTailLoss, once replica-1's forced promotion is under way, brings
// replica-0 back: it rejoins the new primary, which then opens, and cuts
// the tail into an orphan file (loss.Orphans).
func (c *Cluster) FinishTailLoss(ctx context.Context, loss *TailLoss) error {
	if err := c.RestartReplica(ctx, 0); err != nil {
		return fmt.Errorf("tail loss: restart replica-0: %w", err)
	}
	if err := c.waitTakingWrites(ctx, c.Replicas[1]); err != nil {
		return err
	}
	for {
		os, err := datadir.ListOrphans(vfs.OS, loss.OrphanDir)
		if err != nil {
			return err
		}
		if len(os) > 0 {
			loss.Orphans = os
			return nil
		}
		if !backoff.Sleep(ctx, 20*time.Millisecond) {
			return fmt.Errorf("tail loss: waiting for replica-0's orphan file: %w", ctx.Err())
		}
	}
}

// waitTakingWrites waits until n is a primary that takes writes.
func (c *Cluster) waitTakingWrites(ctx context.Context, n *Node) error {
	for {
		if p := n.DataNode().Primary(); p != nil && p.TakingWrites() {
			return nil
		}
		if !backoff.Sleep(ctx, 20*time.Millisecond) {
			return fmt.Errorf("waiting for %s to take writes: %w", n.Name, ctx.Err())
		}
	}
}
