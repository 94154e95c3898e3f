package appliance

import (
	"math"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// tomlBlock finds the TOML examples in the README, the config seeds.
var tomlBlock = regexp.MustCompile("(?s)```toml\n(.*?)```")

// FuzzConfig loads arbitrary bytes as hearth.toml: no panic, and what
// loads is valid: it passes Validate again, and no number is NaN,
// infinite or negative.
func FuzzConfig(f *testing.F) {
	if readme, err := os.ReadFile("../README.md"); err == nil {
		for _, m := range tomlBlock.FindAllSubmatch(readme, -1) {
			f.Add(m[1])
		}
	}
	for _, s := range []string{
		"",
		"state_dir = \"/s\"\n[workspace]\nmount = \"/w\"\n[sandbox]\ncpus = nan\n",
		"[sandbox]\ncpus = inf\nmemory = \"-1\"\ndisk = \"1e30\"\n",
		"[sandbox]\nmemory = -5\nmax_upload = -1\n",
		"[agents]\ngrace = \"-1s\"\non_shutdown = \"leave\"\n[api]\ntcp = \"127.0.0.1:7780\"\n",
		"[model]\nupstream = \"http://x\"\n[credits]\nenabled = true\n",
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		file := filepath.Join(dir, "hearth.toml")
		if err := os.WriteFile(file, data, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(file)
		if err != nil {
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("accepted config fails Validate again: %v", err)
		}
		s := cfg.Sandbox
		if math.IsNaN(s.CPUs) || math.IsInf(s.CPUs, 0) || s.CPUs < 0 {
			t.Errorf("accepted sandbox.cpus = %v", s.CPUs)
		}
		if s.Memory < 0 || s.Disk < 0 || s.MaxUpload < 0 || s.Pids < 0 || s.Warm < 0 {
			t.Errorf("accepted a negative sandbox size or count: %+v", s)
		}
		if s.IdleTimeout < 0 || s.ExecTimeout < 0 || cfg.Agents.Grace < 0 || cfg.Agents.ShutdownTimeout < 0 {
			t.Errorf("accepted a negative duration: %+v %+v", s, cfg.Agents)
		}
	})
}
