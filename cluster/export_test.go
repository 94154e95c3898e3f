package cluster

// Crash stops the member as kill -9 would stop its process: heartbeats
// and River stop at once, nothing is recorded, nobody is told.
func (m *Member) Crash() { m.cancel() }

// PauseHeartbeats stops heartbeats only, as a network partition between
// the node and the database would: its runs go on until its lease ends.
func (m *Member) PauseHeartbeats() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopped = true
}
