package appliance

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
)

// Config is hearth.toml.
type Config struct {
	// StateDir holds the workspace store and the API socket.
	StateDir  string          `toml:"state_dir"`
	Workspace WorkspaceConfig `toml:"workspace"`
}

// WorkspaceConfig configures the shared tree.
type WorkspaceConfig struct {
	// Mount is where the host view of /workspace/agents is mounted.
	Mount string `toml:"mount"`
}

// DefaultConfig is what an empty config file means.
func DefaultConfig() Config {
	return Config{
		StateDir:  "/var/lib/hearth",
		Workspace: WorkspaceConfig{Mount: "/workspace/agents"},
	}
}

// LoadConfig decodes the TOML file at path over the defaults. Unknown keys
// are errors, so a typo does not silently fall back to a default.
func LoadConfig(path string) (Config, error) {
	cfg := DefaultConfig()
	md, err := toml.DecodeFile(path, &cfg)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return cfg, fmt.Errorf("config %s: %s", path, perr.ErrorWithPosition())
		}
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return cfg, fmt.Errorf("config %s: unknown key %s (known: state_dir, workspace.mount)", path, strings.Join(keys, ", "))
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Validate checks values that decoding cannot.
func (c Config) Validate() error {
	for key, p := range map[string]string{"state_dir": c.StateDir, "workspace.mount": c.Workspace.Mount} {
		if p == "" || !filepath.IsAbs(p) {
			return fmt.Errorf("%s = %q: must be an absolute path", key, p)
		}
	}
	rel, err := filepath.Rel(c.StateDir, c.Workspace.Mount)
	if err == nil && !strings.HasPrefix(rel, "..") {
		return fmt.Errorf("workspace.mount = %q is inside state_dir = %q: put it elsewhere", c.Workspace.Mount, c.StateDir)
	}
	return nil
}

// SocketPath is where the daemon serves its API.
func (c Config) SocketPath() string { return filepath.Join(c.StateDir, "hearth.sock") }
