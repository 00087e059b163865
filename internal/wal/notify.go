package wal

// Changed returns a channel that is closed at the log's next change: an
// append, a sync that advances DurableLSN, a truncation, a reset or Close.
// Read the positions after taking the channel, so a change in between is
// not missed.
func (l *Log) Changed() <-chan struct{} {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.notify
}
