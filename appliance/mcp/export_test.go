package mcp

// SetSessionsPerPage makes resources/list pages hold n sessions' outputs
// until restore is called; call it before any server runs.
func SetSessionsPerPage(n int) (restore func()) {
	old := sessionsPerPage
	sessionsPerPage = n
	return func() { sessionsPerPage = old }
}
