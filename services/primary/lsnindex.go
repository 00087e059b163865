package primary

import (
	"sort"
	"sync"
	"time"
)

// lsnIndex remembers, for the most recent batches, where each ended in the
// WAL byte stream and when it was committed, so lag can be given in bytes
// and in seconds ("how long ago was the oldest commit a peer lacks made").
// It is bounded: older batches fall
// off, and answers about them are lower bounds.
type lsnIndex struct {
	mu   sync.Mutex
	ring []batchMark // ring buffer, oldest at head
	head int
	n    int
}

type batchMark struct {
	lastLSN uint64
	endByte uint64 // cumulative WAL payload bytes up to and including this batch
	commit  time.Time
}

func newLSNIndex(size int) *lsnIndex { return &lsnIndex{ring: make([]batchMark, size)} }

func (x *lsnIndex) add(m batchMark) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.n < len(x.ring) {
		x.ring[(x.head+x.n)%len(x.ring)] = m
		x.n++
		return
	}
	x.ring[x.head] = m
	x.head = (x.head + 1) % len(x.ring)
}

func (x *lsnIndex) at(i int) batchMark { return x.ring[(x.head+i)%len(x.ring)] }

// lag reports how far a peer at LSN pos is behind: the WAL bytes it lacks
// and how long ago the oldest commit it lacks was made (0, 0 when caught up).
func (x *lsnIndex) lag(pos uint64, now time.Time) (bytes uint64, age time.Duration) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.n == 0 || x.at(x.n-1).lastLSN <= pos {
		return 0, 0
	}
	// First batch ending after pos: the oldest one the peer lacks.
	i := sort.Search(x.n, func(i int) bool { return x.at(i).lastLSN > pos })
	newest := x.at(x.n - 1)
	var before uint64 // bytes up to the end of the batch before i
	if i > 0 {
		before = x.at(i - 1).endByte
	}
	return newest.endByte - before, now.Sub(x.at(i).commit)
}
