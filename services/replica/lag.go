package replica

import (
	"sync"
	"time"
)

// staleAfter is how many heartbeat intervals without a message from the
// primary make the replica consider itself cut off.
const staleAfter = 3

// lagTracker keeps what the replica knows of the primary's position, so that
// lag in seconds can be computed at scrape time and stays honest both when
// the primary is idle (it reads 0) and when the replica is cut off (it
// grows).
//
// Two clocks meet here: a batch's commit time is the primary's wall clock,
// everything else (contact times, the time a heartbeat first announced an
// LSN the replica does not have) is the replica's. Skew between the two
// machines shows up only while batches are pending.
type lagTracker struct {
	interval time.Duration

	mu          sync.Mutex
	applied     uint64
	primaryLast uint64    // highest LSN the primary reported (heartbeat or batch)
	heard       bool      // a heartbeat has said the primary's last LSN since start
	lastContact time.Time // last batch or heartbeat received (replica clock)
	// behind lists, in ascending LSN order, LSNs beyond applied that the
	// primary is known to have had, each with the earliest time it is known
	// to have had it: a batch's commit time, or the time a heartbeat first
	// announced it. Entries at or below applied are dropped.
	behind []lsnAt
}

type lsnAt struct {
	lsn uint64
	at  time.Time
}

func newLagTracker(interval time.Duration, applied uint64, now time.Time) *lagTracker {
	// Until the primary is heard from, the replica knows nothing newer than
	// its start: counting contact from there makes a replica that never
	// reaches its primary report a growing lag rather than 0.
	return &lagTracker{interval: interval, applied: applied, primaryLast: applied, lastContact: now}
}

// noteLocked records that the primary had lsn at time at.
func (l *lagTracker) noteLocked(lsn uint64, at time.Time) {
	l.primaryLast = max(l.primaryLast, lsn)
	if lsn <= l.applied {
		return
	}
	if n := len(l.behind); n > 0 && l.behind[n-1].lsn >= lsn {
		// An earlier note already covers a later LSN; keep the older time.
		if at.Before(l.behind[n-1].at) {
			l.behind[n-1].at = at
		}
		return
	}
	l.behind = append(l.behind, lsnAt{lsn: lsn, at: at})
}

// heartbeat records the primary's last LSN as announced, received at now.
// A heartbeat announcing an LSN already noted keeps the older time.
func (l *lagTracker) heartbeat(lastLSN uint64, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastContact = now
	l.heard = true
	// A heartbeat is the primary's word on its last LSN now, and it follows
	// every batch sent before it: LSNs beyond it (noted from a primary that
	// since lost them) are no longer owed.
	i := len(l.behind)
	for i > 0 && l.behind[i-1].lsn > lastLSN {
		i--
	}
	l.behind = l.behind[:i]
	l.primaryLast = max(lastLSN, l.applied)
	l.noteLocked(lastLSN, now)
}

// batch records a verified batch ending at lastLSN, committed on the
// primary at commitTime and received at now.
func (l *lagTracker) batch(lastLSN uint64, commitTime, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastContact = now
	if commitTime.IsZero() || commitTime.After(now) {
		commitTime = now // no (or a future) primary clock: count from receipt
	}
	l.noteLocked(lastLSN, commitTime)
}

// contact records any other sign of life from upstream (a snapshot stream
// or a log store read).
func (l *lagTracker) contact(now time.Time) {
	l.mu.Lock()
	l.lastContact = now
	l.mu.Unlock()
}

// lastContactTime is when upstream was last heard from.
func (l *lagTracker) lastContactTime() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastContact
}

// advance records that everything up to lsn is applied.
func (l *lagTracker) advance(lsn uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.applied = max(l.applied, lsn)
	l.primaryLast = max(l.primaryLast, l.applied)
	i := 0
	for i < len(l.behind) && l.behind[i].lsn <= l.applied {
		i++
	}
	l.behind = append(l.behind[:0], l.behind[i:]...)
}

// primaryLSN returns the highest LSN the primary reported.
func (l *lagTracker) primaryLSN() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.primaryLast
}

// heardPrimary reports whether a heartbeat has told the primary's last LSN
// since the replica started: until one does, primaryLSN is only the
// replica's own applied LSN and says nothing of how far behind it is.
func (l *lagTracker) heardPrimary() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heard
}

// seconds is the lag at now: 0 when caught up and in contact; else how long
// the primary is known to have had an LSN the replica has not applied (the
// commit time of the oldest pending batch, or when a heartbeat first
// announced an LSN beyond applied); and, with no contact for staleAfter
// heartbeat intervals, at least the time since the last contact.
func (l *lagTracker) seconds(now time.Time) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lag time.Duration
	for _, b := range l.behind {
		lag = max(lag, now.Sub(b.at))
	}
	if silent := now.Sub(l.lastContact); silent > staleAfter*l.interval {
		lag = max(lag, silent)
	}
	return max(lag, 0).Seconds()
}

// reset moves the applied LSN back to lsn (a replica re-seeded backwards).
func (l *lagTracker) reset(lsn uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.applied = lsn
	l.behind = l.behind[:0]
	l.noteLocked(l.primaryLast, time.Now())
}
