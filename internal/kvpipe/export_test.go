package kvpipe

// SendAnswers is sendAnswers, for tests.
var SendAnswers = sendAnswers

// Queued is how many operations wait to be sent on m's open stream.
func (m *Mux) Queued() int {
	m.mu.Lock()
	p := m.cur
	m.mu.Unlock()
	if p == nil {
		return 0
	}
	p.qmu.Lock()
	defer p.qmu.Unlock()
	n := 0
	for _, msg := range p.msgs {
		n += len(msg.entries)
	}
	return n
}
