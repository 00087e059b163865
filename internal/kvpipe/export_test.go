package kvpipe

// SendAnswers is sendAnswers, for tests.
var SendAnswers = sendAnswers

// Queued is how many requests wait to be sent on m's open stream.
func (m *Mux) Queued() int {
	m.mu.Lock()
	p := m.cur
	m.mu.Unlock()
	if p == nil {
		return 0
	}
	p.qmu.Lock()
	defer p.qmu.Unlock()
	return len(p.queue)
}
