package archive

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/basesnap"
	"github.com/walship/walship/internal/state"
)

// A replica or a log store that neither the primary nor the log stores can
// serve reads the archive back (docs/ARCHITECTURE.md, *Archive*): a run of
// chunks of the lineage (RunReader) and, when its position is no longer
// archived, a base snapshot (LoadSnapshot). Both check every object as a
// restore does; what a reader does with the batches is its own business.

// RunReader yields the batches of a sequence of chunks in LSN order, from
// an LSN on, downloading up to a number of chunks ahead. A batch an earlier
// chunk already held (an upload repeated over an overlapping range) is
// passed over; one that straddles the end of the batches yielded so far is
// a CorruptError: the chunks disagree on the log's batch boundaries.
type RunReader struct {
	a       *Archive
	cluster string
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	ahead   chan chan fetchedChunk
	cur     []*walshipv1.WalBatch
	chunk   Chunk
	next    uint64
	failed  error
}

type fetchedChunk struct {
	c    Chunk
	envs []*walshipv1.WalBatch
	err  error
}

// ReadRun starts reading chunks (in the order given: a Run's) from LSN
// from on, parallel chunks at a time. Close ends it.
func (a *Archive) ReadRun(ctx context.Context, cluster string, chunks []Chunk, from uint64, parallel int) *RunReader {
	ctx, cancel := context.WithCancel(ctx)
	r := &RunReader{a: a, cluster: cluster, ctx: ctx, cancel: cancel, ahead: make(chan chan fetchedChunk, max(1, parallel)-1), next: from}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(r.ahead)
		for _, c := range chunks {
			if c.LastLSN < from {
				continue
			}
			done := make(chan fetchedChunk, 1)
			select {
			case r.ahead <- done:
			case <-ctx.Done():
				return
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				envs, err := a.GetChunk(ctx, cluster, c)
				done <- fetchedChunk{c: c, envs: envs, err: err}
			}()
		}
	}()
	return r
}

// Next returns the next batch and the chunk that holds it; io.EOF after
// the last. An error ends the reader: every later call returns it.
func (r *RunReader) Next() (*walshipv1.WalBatch, Chunk, error) {
	for len(r.cur) == 0 {
		if r.failed != nil {
			return nil, Chunk{}, r.failed
		}
		var done chan fetchedChunk
		var ok bool
		select {
		case done, ok = <-r.ahead:
		case <-r.ctx.Done():
			r.failed = r.ctx.Err()
			continue
		}
		if !ok {
			r.failed = io.EOF
			continue
		}
		var f fetchedChunk
		select {
		case f = <-done:
		case <-r.ctx.Done():
			r.failed = r.ctx.Err()
			continue
		}
		if f.err != nil {
			r.failed = f.err
			continue
		}
		r.chunk = f.c
		for _, env := range f.envs {
			if env.GetLastLsn() < r.next {
				continue // held by the chunk before
			}
			if env.GetFirstLsn() < r.next {
				// The batches before it are still yielded; then the error.
				r.failed = corrupt(ChunkName(f.c), "batch %d..%d straddles LSN %d, where the batches before it ended: the chunks do not hold the same batches",
					env.GetFirstLsn(), env.GetLastLsn(), r.next-1)
				break
			}
			r.cur = append(r.cur, env)
			r.next = env.GetLastLsn() + 1
		}
	}
	env := r.cur[0]
	r.cur = r.cur[1:]
	return env, r.chunk, nil
}

// Close stops the downloads and waits for them.
func (r *RunReader) Close() {
	r.cancel()
	r.wg.Wait()
}

// LoadSnapshot downloads the base snapshot ref into a temporary file in
// tmpDir (removed before it returns), checks it whole — its checksum, its
// meta against its name and the cluster, the state's order, count, CRC and
// digest — and builds the state it holds. It returns the state and the
// snapshot's meta (its LSN, epoch, history). A damaged snapshot is a
// CorruptError.
func (a *Archive) LoadSnapshot(ctx context.Context, cluster string, ref SnapshotRef, tmpDir string) (*state.Store, *walshipv1.SnapshotHeader, error) {
	f, size, err := a.FetchSnapshot(ctx, cluster, ref, tmpDir)
	if err != nil {
		return nil, nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close() // read-only
	name := SnapshotName(ref)
	hdr, off, err := basesnap.DecodeMeta(f, size)
	if err != nil {
		if errors.Is(err, basesnap.ErrBad) {
			return nil, nil, corrupt(name, "%v", err)
		}
		return nil, nil, fmt.Errorf("%s: read %s: %w", a.bucket, name, err)
	}
	if err := CheckSnapshotMeta(ref, cluster, hdr); err != nil {
		return nil, nil, err
	}
	b := state.NewBuilder(hdr.GetLsn())
	d, err := basesnap.Scan(f, size, off, hdr, name, func(k, v []byte, ver uint64) error {
		if err := b.Add(k, v, ver); err != nil {
			return corrupt(name, "%v", err)
		}
		return ctx.Err()
	})
	if err != nil {
		if errors.Is(err, basesnap.ErrBad) {
			return nil, nil, corrupt(name, "%v", err)
		}
		return nil, nil, err
	}
	st, err := b.Finish(hdr.GetKeys(), d.String())
	if err != nil {
		return nil, nil, corrupt(name, "%v", err)
	}
	return st, hdr, nil
}
