package chv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"hearth/vmm"
	"hearth/vmm/vmmtest"
)

var (
	doubleOnce sync.Once
	doubleBin  string
	doubleErr  error
)

// chvDouble builds the contract double standing in for cloud-hypervisor
// (vmm/chv/chvdouble) once per test binary, and points it at the guest
// agent it runs as a host process.
func chvDouble(t testing.TB) string {
	t.Helper()
	agent := vmmtest.GuestAgent(t)
	doubleOnce.Do(func() {
		dir, err := os.MkdirTemp("", "chv-double-")
		if err != nil {
			doubleErr = err
			return
		}
		doubleBin = filepath.Join(dir, "chv-double")
		out, err := exec.Command("go", "build", "-o", doubleBin, "hearth/vmm/chv/chvdouble/cmd/chv-double").CombinedOutput()
		if err != nil {
			doubleErr = fmt.Errorf("%w: %s", err, out)
		}
	})
	if doubleErr != nil {
		t.Fatalf("build chv-double: %v", doubleErr)
	}
	os.Setenv("CHV_DOUBLE_GUEST", agent)
	return doubleBin
}

// needVirtiofsd skips a test that serves a workspace when virtiofsd is
// missing.
func needVirtiofsd(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(DefaultConfig("").Virtiofsd); err != nil {
		t.Skipf("workspace tests need virtiofsd at %s: apt-get install qemu-system-common", DefaultConfig("").Virtiofsd)
	}
}

// shortTemp is a temporary directory with a short path: unix socket
// paths under it must stay within 107 bytes.
func shortTemp(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "chv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// doubleDriver is a driver whose cloud-hypervisor is the double. The
// kernel, initramfs and image are files the double only opens: it boots
// nothing.
func doubleDriver(t testing.TB) (*Driver, func(id string) vmm.Spec) {
	t.Helper()
	bin := chvDouble(t)
	dir := shortTemp(t)
	cfg := DefaultConfig(filepath.Join(dir, "state"))
	cfg.CloudHypervisor = bin
	cfg.Kernel = filepath.Join(dir, "vmlinux")
	cfg.Initramfs = filepath.Join(dir, "initramfs")
	root := filepath.Join(dir, "rootfs.ext4")
	for _, f := range []string{cfg.Kernel, cfg.Initramfs, root} {
		if err := os.WriteFile(f, []byte("opened, never booted, by the chv double\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New = %v", err)
	}
	t.Cleanup(func() {
		// Whatever a failed test left running.
		ids, _ := d.List(context.Background())
		for _, id := range ids {
			if m, err := d.Recover(context.Background(), id); err == nil {
				m.Destroy(context.Background())
			}
		}
		d.Close()
		if left := processesUnder(dir); len(left) > 0 {
			t.Errorf("processes outlived the test: %s", strings.Join(left, "; "))
		}
	})
	// The double runs the agent on the host as root, as the user the
	// kernel command line names: stay root, so its files in /tmp are the
	// test's own.
	spec := func(id string) vmm.Spec {
		return vmm.Spec{ID: id, RootFS: root, Memory: 256 << 20, CPUs: 1, Disk: 64 << 20}
	}
	return d, spec
}

// create makes a machine destroyed when the test ends.
func create(t *testing.T, d *Driver, spec vmm.Spec) *machine {
	t.Helper()
	m, err := d.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create(%s) = %v", spec.ID, err)
	}
	t.Cleanup(func() { m.Destroy(context.Background()) })
	return m.(*machine)
}

// processesUnder lists the processes whose command line names dir: the
// VMMs, virtiofsds and agents of a test's machines. Their exit may lag a
// moment behind the call that ended them.
func processesUnder(dir string) []string {
	var left []string
	for try := 0; try < 50; try++ {
		left = nil
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			if _, err := strconv.Atoi(e.Name()); err != nil {
				continue
			}
			b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err == nil && bytes.Contains(b, []byte(dir)) {
				left = append(left, e.Name()+" "+string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
			}
		}
		if len(left) == 0 {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return left
}

func TestMain(m *testing.M) {
	code := m.Run()
	if doubleBin != "" {
		os.RemoveAll(filepath.Dir(doubleBin))
	}
	os.Exit(code)
}
