package client_test

import (
	"testing"

	"hearth/appliance"
	"hearth/client"
)

// TestMaxInputFilesMatchesDaemon: the client refuses input files at the
// size the daemon does, so a user hears it before the upload starts.
func TestMaxInputFilesMatchesDaemon(t *testing.T) {
	if client.MaxInputFiles != appliance.MaxInputFiles {
		t.Errorf("client.MaxInputFiles = %d, the daemon takes %d", client.MaxInputFiles, appliance.MaxInputFiles)
	}
}
