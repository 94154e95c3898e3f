package appliance

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/image"
	"hearth/vmm/qemu"
)

func TestChooseTier(t *testing.T) {
	noCHV := errors.New("cloud-hypervisor is not installed")
	noQEMU := errors.New("qemu-system-x86_64 not found")
	pvm := errors.New("KVM cannot boot a stock kernel")
	ok := error(nil)
	cases := []struct {
		name              string
		want              string
		allowTCG          bool
		chv, qemu, kvm    error
		tier, why, errMsg string
		tcg               bool
		asked             string // the probes asked, in order
	}{
		{name: "auto, hardware KVM and cloud-hypervisor", want: "auto", chv: ok, tier: "chv", asked: "chv"},
		{name: "auto, KVM but no cloud-hypervisor", want: "auto", chv: noCHV, qemu: ok, kvm: ok, tier: "qemu", why: "not installed", asked: "chv qemu kvm"},
		{name: "auto, a KVM that boots no stock kernel", want: "auto", chv: noCHV, qemu: ok, kvm: pvm, tier: "jail", why: "cannot boot", asked: "chv qemu kvm"},
		{name: "auto never picks TCG", want: "", allowTCG: true, chv: noCHV, qemu: ok, kvm: pvm, tier: "jail", asked: "chv qemu kvm"},
		{name: "auto, nothing", want: "auto", chv: noCHV, qemu: noQEMU, tier: "jail", why: "qemu-system-x86_64 not found", asked: "chv qemu"},
		{name: "forced jail asks nothing", want: "jail", chv: ok, qemu: ok, kvm: ok, tier: "jail", asked: ""},
		{name: "forced chv, missing", want: "chv", chv: noCHV, errMsg: `sandbox.tier = "chv", but cloud-hypervisor is not installed`, asked: "chv"},
		{name: "forced qemu without TCG", want: "qemu", qemu: ok, kvm: pvm, errMsg: "set sandbox.allow_tcg = true", asked: "qemu kvm"},
		{name: "forced qemu with TCG", want: "qemu", allowTCG: true, qemu: ok, kvm: pvm, tier: "qemu", tcg: true, why: "software emulation", asked: "qemu kvm"},
		{name: "forced qemu with KVM", want: "qemu", qemu: ok, kvm: ok, tier: "qemu", asked: "qemu kvm"},
		{name: "unknown", want: "firecracker", errMsg: `sandbox.tier = "firecracker": use auto, chv, qemu or jail`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var asked []string
			probe := func(name string, err error) func() error {
				return func() error { asked = append(asked, name); return err }
			}
			got, err := chooseTier(tc.want, tc.allowTCG, tierProbes{chv: probe("chv", tc.chv), qemu: probe("qemu", tc.qemu), qemuKVM: probe("kvm", tc.kvm)})
			if tc.errMsg != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errMsg) {
					t.Fatalf("chooseTier = %+v, %v; want an error with %q", got, err, tc.errMsg)
				}
			} else if err != nil || got.Tier != tc.tier || got.TCG != tc.tcg || !strings.Contains(got.Why, tc.why) {
				t.Fatalf("chooseTier = %+v, %v; want %s (tcg %v) because of %q", got, err, tc.tier, tc.tcg, tc.why)
			}
			if strings.Join(asked, " ") != tc.asked {
				t.Errorf("asked %q, want %q", asked, tc.asked)
			}
		})
	}
}

// TestTiersOnThisHost starts daemons on the real host: auto picks what
// the host can run (here, where KVM boots no stock kernel, the jail) and
// says why; a forced qemu tier refuses to start without allow_tcg where
// KVM cannot boot, and with it runs a sandbox in a real VM.
func TestTiersOnThisHost(t *testing.T) {
	needQEMU(t)
	cfg := sandboxConfig(t)
	cfg.Sandbox.Tier = TierAuto
	ctx := context.Background()
	d, err := Start(context.Background(), cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	tier, why := d.Tier()
	d.Close()
	kvmErr := qemu.BootsWithKVM(ctx, qemu.Config{Kernel: bootOf(t, cfg).Kernel, Initramfs: bootOf(t, cfg).Initramfs})
	switch {
	case kvmErr == nil && tier != TierQEMU && tier != TierCHV:
		t.Errorf("KVM boots a stock kernel here, but auto picked %s (%s)", tier, why)
	case kvmErr != nil && (tier != TierJail || !strings.Contains(why, "qemu:")):
		t.Errorf("KVM boots no stock kernel here (%v), but auto picked %s (%s); want the jail, saying why not qemu", kvmErr, tier, why)
	}
	if doc := Doctor(cfg); doc.Tier != tier || !strings.Contains(doc.Why, "picked when the daemon last started") {
		t.Errorf("doctor after the start = %s (%s), want %s as the daemon picked", doc.Tier, doc.Why, tier)
	}
	if kvmErr == nil {
		return // the rest is about hosts without a KVM that boots stock kernels
	}

	cfg.Sandbox.Tier = TierQEMU
	if d, err := Start(context.Background(), cfg, testLogger(t)); err == nil || !strings.Contains(err.Error(), "allow_tcg") {
		if err == nil {
			d.Close()
		}
		t.Fatalf("forced qemu without allow_tcg where KVM cannot boot: Start = %v, want it refused, naming allow_tcg", err)
	}
	cfg.Sandbox.AllowTCG = true
	cfg.Sandbox.Memory = 256 << 20
	d, c := startSandboxDaemon(t, cfg)
	if tier, why := d.Tier(); tier != TierQEMU || !strings.Contains(why, "software emulation") {
		t.Fatalf("forced qemu with allow_tcg: tier %s (%s)", tier, why)
	}
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "vm", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	st, err := c.Exec(ctx, "vm", ExecRequest{Argv: []string{"sh", "-c", "uname -r; ls /workspace/agents >/dev/null && echo workspace"}}, &out, io.Discard)
	if err != nil || st.Code != 0 || !strings.Contains(out.String(), "cloud-amd64") || !strings.Contains(out.String(), "workspace") {
		t.Fatalf("exec in the VM sandbox = %q, %+v, %v; want the guest's own cloud kernel and its workspace", out.String(), st, err)
	}
}

// bootOf returns the VM kernel and initramfs of cfg's image cache (made
// by the daemon's start).
func bootOf(t *testing.T, cfg Config) image.Boot {
	t.Helper()
	cat, _ := image.BuiltinCatalog()
	b, err := image.NewBuilder(filepath.Join(cfg.StateDir, "images"), cat, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	bt, err := b.Boot(context.Background(), cfg.Sandbox.Agent)
	if err != nil {
		t.Fatal(err)
	}
	return bt
}

// TestAgentInQEMU runs an agent task in a real VM: the claude CLI in the
// claude-code image booted by QEMU (under TCG here), reaching the
// gateway through a port forwarded to the VM's loopback and writing its
// output through virtio-fs into its session.
func TestAgentInQEMU(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not on PATH: apt-get install qemu-system-x86 (scripts/test.sh does)")
	}
	env := startAgentDaemon(t, modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
		bashTurn("mkdir -p outputs; id > outputs/who.md; uname -r >> outputs/who.md", modeltest.Usage{InputTokens: 100}),
		textTurn("done")}},
		func(c *Config) { c.Sandbox.Tier = TierQEMU; c.Sandbox.AllowTCG = true; c.Sandbox.Warm = 1 })
	ctx := context.Background()
	// The first execution boots its VM; the second takes the one booted
	// ahead of time meanwhile.
	for i := 0; i < 2; i++ {
		e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go"})
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Minute); !Ended(e) && time.Now().Before(deadline); time.Sleep(time.Second) {
			if e, err = env.c.Execution(ctx, e.Id); err != nil {
				t.Fatal(err)
			}
		}
		if e.Status != "completed" || e.Turns != 2 || !slices.Contains(e.Outputs, "outputs/who.md") {
			t.Fatalf("execution %d in a VM = %+v\n%s\n%s", i, e, eventDump(allEvents(t, env.c, e.Id)), qemuState(env.cfg.StateDir))
		}
		var who strings.Builder
		if _, err := env.c.DownloadOutput(ctx, e.Id, "outputs/who.md", &who); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(who.String(), "uid=1000(agent)") || !strings.Contains(who.String(), "cloud-amd64") {
			t.Errorf("who.md = %q: want the agent user and the VM's own cloud kernel", who.String())
		}
	}
	audit, _ := os.ReadFile(filepath.Join(env.cfg.StateDir, "qemu", "audit.jsonl"))
	if n := strings.Count(string(audit), "took warm machine"); n != 1 {
		t.Errorf("%d executions took a warm VM, want the second; the qemu audit log:\n%s", n, audit)
	}
}

// qemuState is what the QEMU driver's state says of its machines, for a
// failure: its audit log and the end of each live machine's console.
func qemuState(stateDir string) string {
	dir := filepath.Join(stateDir, "qemu")
	var b strings.Builder
	audit, _ := os.ReadFile(filepath.Join(dir, "audit.jsonl"))
	b.WriteString("qemu audit log:\n" + string(audit))
	logs, _ := filepath.Glob(filepath.Join(dir, "*", "*", "serial.log"))
	for _, l := range logs { // machines/<id>/ and spares/<id>/
		data, _ := os.ReadFile(l)
		b.WriteString("\n" + l + ", its last 4 kB:\n" + string(data[max(0, len(data)-4096):]))
	}
	return b.String()
}
