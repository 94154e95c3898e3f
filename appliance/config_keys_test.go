package appliance

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestConfigKeys: the unknown-key error lists every key, nested sections
// and the providers map included, read from Config itself.
func TestConfigKeys(t *testing.T) {
	keys := ConfigKeys()
	for _, want := range []string{"state_dir", "sandbox.warm", "agents.call_snapshots", "agents.call_snapshot_bytes", "providers.<name>.upstream", "workspace.session_bytes"} {
		if !slices.Contains(keys, want) {
			t.Errorf("ConfigKeys() lacks %q: %v", want, keys)
		}
	}
	path := filepath.Join(t.TempDir(), "hearth.toml")
	os.WriteFile(path, []byte("[agents]\ncall_snapshot = \"all\"\n"), 0o600)
	_, err := LoadConfig(path)
	if err == nil || !strings.Contains(err.Error(), "unknown key agents.call_snapshot ") || !strings.Contains(err.Error(), "agents.call_snapshots") {
		t.Fatalf("LoadConfig with a typo = %v; want the unknown key named and the known ones listed", err)
	}
}
