package appliance

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"hearth/appliance/appliancetest"
)

// sandboxConfig returns a config on temporary directories whose daemon
// can run sandboxes of the tiny image.
func sandboxConfig(t testing.TB) Config {
	t.Helper()
	cfg := agentConfig(t)
	cfg.Sandbox.DefaultImage = "tiny"
	appliancetest.AddTinyImage(t, filepath.Join(cfg.StateDir, "images"))
	return cfg
}

// needQEMU skips a test that boots a VM where QEMU or its kernel's
// source is missing.
func needQEMU(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not on PATH: apt-get install qemu-system-x86 (scripts/test.sh does)")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("the VM kernel comes from Debian's linux-image-cloud-amd64, fetched with apt-get")
	}
}

// qemuSandboxConfig is sandboxConfig on the QEMU tier (under TCG here),
// with small VMs; it skips where QEMU cannot run.
func qemuSandboxConfig(t testing.TB) Config {
	t.Helper()
	needQEMU(t)
	cfg := sandboxConfig(t)
	cfg.Sandbox.Tier = TierQEMU
	cfg.Sandbox.AllowTCG = true
	cfg.Sandbox.Memory = 256 << 20
	return cfg
}

// onJailAndQEMU runs f as two subtests, on the jail tier and on the QEMU
// tier (skipped where QEMU cannot run), each with its sandboxConfig.
func onJailAndQEMU(t *testing.T, f func(*testing.T, Config)) {
	t.Run("jail", func(t *testing.T) { f(t, sandboxConfig(t)) })
	t.Run("qemu", func(t *testing.T) { f(t, qemuSandboxConfig(t)) })
}

// agentConfig returns a config on temporary directories whose daemon can
// run sandboxes, with no image yet.
func agentConfig(t testing.TB) Config {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sandboxes need root (namespaces, mounts, cgroups, FUSE)")
	}
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.StateDir, cfg.Workspace.Mount = filepath.Join(dir, "state"), filepath.Join(dir, "agents")
	cfg.Sandbox.Agent = appliancetest.Agent(t)
	cfg.Sandbox.Tier = TierJail // the VM tiers have tests of their own
	cfg.Sandbox.MaxUpload = 1 << 20
	os.MkdirAll(cfg.StateDir, 0o700)
	return cfg
}

// startSandboxDaemon starts a daemon on cfg; cleanup destroys what
// sandboxes are left and closes it.
func startSandboxDaemon(t testing.TB, cfg Config) (*Daemon, *Client) {
	t.Helper()
	d, err := Start(context.Background(), cfg, testLogger(t))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { destroyAll(d); d.Close() })
	return d, NewClient(cfg.SocketPath())
}

func destroyAll(d *Daemon) {
	for _, s := range d.sbx.list() {
		d.sbx.Destroy(context.Background(), s.rec.ID)
	}
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testLogger sends the daemon's log to the test's.
func testLogger(t testing.TB) *slog.Logger { return slog.New(slog.NewTextHandler(logWriter{t}, nil)) }

// errorCase is a call that must fail with an API error of code and
// HTTP status whose message contains msg.
type errorCase struct {
	name   string
	call   func() error
	code   string
	status int
	msg    string
}

func runErrorCases(t *testing.T, cases []errorCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			wantCode(t, err, tc.code, tc.status)
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q, want it to contain %q", err, tc.msg)
			}
		})
	}
}
