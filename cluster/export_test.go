package cluster

// Crash stops the member as kill -9 would stop its process: heartbeats
// and runs stop at once and nothing of the cluster's is recorded, except
// that River, its context cancelled, resigns leadership (a real SIGKILL
// is TestKilledLeaderProcess).
func (m *Member) Crash() { m.cancel() }

// PauseHeartbeats stops heartbeats only, as a network partition between
// the node and the database would: its runs go on until its lease ends.
func (m *Member) PauseHeartbeats() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopped = true
}
