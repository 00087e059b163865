package restore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/wal"
)

// The restored directory's WAL holds one batch: the one that ends at the
// restored LSN, byte for byte as the source stored it (its epoch is the
// lineage's, its commit time the source primary's). A primary started on
// the directory ships its WAL from its first batch to log stores that hold
// nothing, and a log store takes a base snapshot only at the end of a
// batch it holds (services/logstore, "Base snapshots"): with this batch,
// the new log stores hold the restored LSN as a batch end, and the
// primary's upload of the snapshot it recovered from is accepted at once
// instead of waiting for its first periodic snapshot. Without it, until
// then, neither the new log stores nor their archive could restore the
// new cluster or re-seed a replica.
//
// Recovery then finds a WAL that ends at the snapshot's LSN: nothing to
// replay, and the next batch starts after it. With Options.NewCluster the
// WAL also holds, after it, the batch of the new cluster's epoch record
// (newcluster.go), and the snapshot is at that batch's end.

// findTail sets r.tail to the batch ending at lsn when the replay did not
// read it (the target is the base snapshot's LSN): from a log store that
// holds it, or the archive's chunk. It is best effort — the source's
// retention may have cut that batch — and a miss is logged: the primary
// started on the directory then warns that its log stores cannot restore
// the cluster until it uploads a snapshot of its own.
func (r *restorer) findTail(ctx context.Context, lsn uint64) {
	if lsn == 0 || (r.tail != nil && r.tail.GetLastLsn() == lsn) {
		return
	}
	r.tail = nil
	var err error
	if r.arch != nil {
		r.tail, err = r.arch.batchEnding(ctx, lsn)
	} else {
		r.tail, err = r.batchEnding(ctx, lsn)
	}
	if err == nil {
		err = r.checkTail(lsn)
	}
	if err != nil {
		r.tail = nil
		r.o.Logger.Warn("the restored directory's WAL will not hold the batch ending at the restored LSN: a primary started on it cannot give its new log stores a base snapshot until it takes one of its own",
			"lsn", lsn, "err", err)
	}
}

// checkTail checks the tail as readBatches checks a replayed batch.
func (r *restorer) checkTail(lsn uint64) error {
	env := r.tail
	if env == nil {
		return errors.New("no source holds it")
	}
	if err := envelope.Verify(env); err != nil {
		return err
	}
	if env.GetLastLsn() != lsn || r.lineage.EpochOf(env.GetFirstLsn()) != env.GetEpoch() || r.lineage.EpochOf(lsn) != env.GetEpoch() {
		return fmt.Errorf("the batch read is LSNs %d..%d of epoch %d; the lineage %v gives LSN %d to epoch %d",
			env.GetFirstLsn(), env.GetLastLsn(), env.GetEpoch(), r.lineage, lsn, r.lineage.EpochOf(lsn))
	}
	return nil
}

// batchEnding reads the batch ending at lsn from the first log store that
// holds it.
func (r *restorer) batchEnding(ctx context.Context, lsn uint64) (*walshipv1.WalBatch, error) {
	var errs []error
	for _, src := range r.sources {
		if src.Err != nil || src.FirstLSN == 0 || src.FirstLSN > lsn || src.Usable < lsn {
			continue
		}
		env, err := readOne(ctx, r.conns[src.Addr], lsn, r.o.ClusterID)
		if err == nil {
			return env, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", src.Addr, err))
	}
	if len(errs) == 0 {
		return nil, errors.New("no log store holds it (their retention cut it)")
	}
	return nil, errors.Join(errs...)
}

func readOne(ctx context.Context, c *client, lsn uint64, cluster string) (*walshipv1.WalBatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Read(ctx, &walshipv1.ReadRequest{FromLsn: lsn, ToLsn: lsn, ClusterId: cluster})
	if err != nil {
		return nil, err
	}
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("the read ended before LSN %d", lsn)
		}
		if err != nil {
			return nil, err
		}
		if env := m.GetBatch(); env.GetLastLsn() >= lsn {
			return env, nil
		}
	}
}

// batchEnding reads the batch ending at lsn from the archive's chunk of
// the lineage that holds it.
func (src *archiveSource) batchEnding(ctx context.Context, lsn uint64) (*walshipv1.WalBatch, error) {
	for _, c := range src.cat.Chunks {
		if c.FirstLSN > lsn || c.LastLSN < lsn || !src.cat.InLineage(c) {
			continue
		}
		envs, err := src.a.GetChunk(ctx, src.cat.ClusterID, c)
		if err != nil {
			return nil, err
		}
		for _, env := range envs {
			if env.GetFirstLsn() <= lsn && env.GetLastLsn() >= lsn {
				return env, nil
			}
		}
	}
	return nil, errors.New("no archived chunk of the lineage holds it")
}

// writeTail writes r.tail, if any, and the new cluster's first batch, if
// any, as the directory's WAL.
func (r *restorer) writeTail() error {
	var entries []wal.Entry
	for _, env := range []*walshipv1.WalBatch{r.tail, r.first} {
		if env == nil {
			continue
		}
		data, err := envelope.Marshal(env)
		if err != nil {
			return fmt.Errorf("write the WAL: %w", err)
		}
		entries = append(entries, wal.Entry{FirstLSN: env.GetFirstLsn(), LastLSN: env.GetLastLsn(), Data: data})
	}
	if len(entries) == 0 {
		return nil
	}
	log, err := wal.Open(wal.Options{Dir: filepath.Join(r.o.DataDir, "wal"), FS: r.o.FS})
	if err != nil {
		return fmt.Errorf("write the WAL: %w", err)
	}
	err = log.Append(entries...)
	if err == nil {
		err = log.Sync()
	}
	if cerr := log.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write the WAL: %w", err)
	}
	return nil
}
