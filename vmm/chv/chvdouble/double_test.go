package chvdouble

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hearth/vmm/chv/api"
	"hearth/vmm/vmmtest"
)

// guestAgent builds hearth-guest, which the double runs on boot.
func guestAgent(t *testing.T) string { return vmmtest.GuestAgent(t) }

// vmmUnderTest is one double serving on a socket in dir.
type vmmUnderTest struct {
	t    *testing.T
	dir  string
	sock string
	c    *api.Client
	errc chan error
}

func startDouble(t *testing.T, dir string) *vmmUnderTest {
	t.Helper()
	sock := filepath.Join(dir, "api.sock")
	v, err := Listen(Options{APISocket: sock, Guest: guestAgent(t)})
	if err != nil {
		t.Fatalf("Listen = %v", err)
	}
	u := &vmmUnderTest{t: t, dir: dir, sock: sock, errc: make(chan error, 1)}
	go func() { u.errc <- v.Serve() }()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	u.c, _ = api.NewClient("http://localhost/api/v1", api.WithHTTPClient(hc))
	t.Cleanup(func() {
		if resp, err := u.c.ShutdownVMM(context.Background()); err == nil {
			resp.Body.Close()
		}
		select {
		case <-u.errc:
		case <-time.After(5 * time.Second):
			t.Errorf("double still serving 5s after vmm.shutdown")
		}
	})
	return u
}

// check asserts a call's status, and that an error body is upstream's
// JSON array of strings. It returns the body.
func (u *vmmUnderTest) check(what string, resp *http.Response, err error, want int) []byte {
	u.t.Helper()
	if err != nil {
		u.t.Fatalf("%s: %v", what, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		u.t.Fatalf("%s = %d %s, want %d", what, resp.StatusCode, body, want)
	}
	if want >= 400 {
		var msgs []string
		if err := json.Unmarshal(body, &msgs); err != nil || len(msgs) == 0 {
			u.t.Errorf("%s: error body %q is not a JSON array of strings", what, body)
		}
	}
	return body
}

// tmp is a short directory (unix socket paths stay short).
func tmp(t *testing.T) string {
	dir, err := os.MkdirTemp("", "chvd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// config is a VM the double can boot: a kernel file it opens, a vsock
// socket and the agent's channel on the command line.
func config(t *testing.T, dir string) api.VmConfig {
	kernel := filepath.Join(dir, "vmlinux")
	os.WriteFile(kernel, []byte("opened, never booted\n"), 0o600)
	cmdline := "console=ttyS0 hearth.channel=vsock-listen:1024 hearth.uid=0 hearth.gid=0"
	return api.VmConfig{
		Payload: api.PayloadConfig{Kernel: &kernel, Cmdline: &cmdline},
		Vsock:   &api.VsockConfig{Cid: 3, Socket: filepath.Join(dir, "vsock.sock")},
		Console: &api.ConsoleConfig{Mode: "Off"},
	}
}

func TestRejectsInvalidRequests(t *testing.T) {
	u := startDouble(t, tmp(t))
	for _, tc := range []struct {
		name, path, body, want string
	}{
		{"not JSON", "/vm.create", `{"payload":`, "request body"},
		{"no payload", "/vm.create", `{}`, "payload"},
		{"zero vcpus", "/vm.create", `{"payload":{},"cpus":{"boot_vcpus":0,"max_vcpus":1}}`, "boot_vcpus"},
		{"cpus without max", "/vm.create", `{"payload":{},"cpus":{"boot_vcpus":1}}`, "max_vcpus"},
		{"memory size a string", "/vm.create", `{"payload":{},"memory":{"size":"1G"}}`, "size"},
		{"vsock cid 2", "/vm.create", `{"payload":{},"vsock":{"cid":2,"socket":"/x"}}`, "cid"},
		{"fs without tag", "/vm.add-fs", `{"socket":"/x","num_queues":1,"queue_size":1024}`, "tag"},
		{"console mode unknown", "/vm.create", `{"payload":{},"console":{"mode":"Loud"}}`, "mode"},
		{"restore without source", "/vm.restore", `{"resume":true}`, "source_url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := *u
			u.t = t
			resp, err := u.c.CreateVMWithBody(context.Background(), "application/json", strings.NewReader(tc.body), func(ctx context.Context, r *http.Request) error {
				r.URL.Path = "/api/v1" + tc.path
				return nil
			})
			body := u.check("PUT "+tc.path+" "+tc.body, resp, err, http.StatusBadRequest)
			if !strings.Contains(string(body), tc.want) {
				t.Errorf("PUT %s %s: %s, want it to name %q", tc.path, tc.body, body, tc.want)
			}
		})
	}
	// Nothing invalid reached the state machine.
	resp, err := u.c.GetVmInfo(context.Background())
	u.check("vm.info after invalid requests", resp, err, http.StatusNotFound)
	// A body with no JSON content type is refused too.
	resp, err = u.c.CreateVMWithBody(context.Background(), "text/plain", strings.NewReader(`{"payload":{}}`))
	u.check("vm.create as text/plain", resp, err, http.StatusBadRequest)
}

// TestStateMachine walks upstream's states with every call, right and
// wrong, checking the statuses upstream sends.
func TestStateMachine(t *testing.T) {
	dir := tmp(t)
	u := startDouble(t, dir)
	ctx := context.Background()
	cfg := config(t, dir)
	snap := filepath.Join(dir, "snap")
	os.Mkdir(snap, 0o700)
	snapURL := "file://" + snap
	type call struct {
		name string
		do   func() (*http.Response, error)
	}
	var (
		info     = call{"vm.info", func() (*http.Response, error) { return u.c.GetVmInfo(ctx) }}
		create   = call{"vm.create", func() (*http.Response, error) { return u.c.CreateVM(ctx, cfg) }}
		boot     = call{"vm.boot", func() (*http.Response, error) { return u.c.BootVM(ctx) }}
		pause    = call{"vm.pause", func() (*http.Response, error) { return u.c.PauseVM(ctx) }}
		resume   = call{"vm.resume", func() (*http.Response, error) { return u.c.ResumeVM(ctx) }}
		shutdown = call{"vm.shutdown", func() (*http.Response, error) { return u.c.ShutdownVM(ctx) }}
		del      = call{"vm.delete", func() (*http.Response, error) { return u.c.DeleteVM(ctx) }}
		snapshot = call{"vm.snapshot", func() (*http.Response, error) {
			return u.c.PutVmSnapshot(ctx, api.VmSnapshotConfig{DestinationUrl: &snapURL})
		}}
		restore = call{"vm.restore", func() (*http.Response, error) {
			return u.c.PutVmRestore(ctx, api.RestoreConfig{SourceUrl: snapURL})
		}}
		unlinkVsock = call{"(unlink the vsock socket)", nil}
	)
	state := func(want api.VmState) {
		t.Helper()
		resp, err := info.do()
		var vi api.VmInfo
		json.Unmarshal(u.check("vm.info", resp, err, http.StatusOK), &vi)
		if vi.State != want {
			t.Fatalf("vm.info state = %s, want %s", vi.State, want)
		}
	}
	steps := []struct {
		c    call
		want int
		then api.VmState
	}{
		// No VM.
		{info, 404, ""}, {boot, 404, ""}, {pause, 500, ""}, {resume, 500, ""},
		{shutdown, 500, ""}, {snapshot, 500, ""}, {del, 204, ""},
		// Created.
		{create, 204, api.Created}, {create, 500, api.Created}, {pause, 500, api.Created},
		{resume, 500, api.Created}, {shutdown, 500, api.Created}, {snapshot, 500, api.Created},
		{restore, 500, api.Created},
		// Running.
		{boot, 204, api.Running}, {boot, 500, api.Running}, {resume, 500, api.Running},
		{snapshot, 500, api.Running}, {restore, 500, api.Running},
		// Paused.
		{pause, 204, api.Paused}, {pause, 500, api.Paused}, {boot, 500, api.Paused},
		{snapshot, 204, api.Paused}, {resume, 204, api.Running}, {pause, 204, api.Paused},
		// Shut down: the config stays; upstream leaves the vsock socket
		// file behind, so booting again needs it unlinked first.
		{shutdown, 204, api.Created}, {boot, 500, api.Created},
		{unlinkVsock, 0, api.Created}, {boot, 204, api.Running},
		{del, 204, ""}, {info, 404, ""},
	}
	for _, s := range steps {
		if s.c.do == nil {
			os.Remove(cfg.Vsock.Socket)
			continue
		}
		resp, err := s.c.do()
		u.check(s.c.name, resp, err, s.want)
		if s.then != "" {
			state(s.then)
		}
	}
	for _, f := range []string{"config.json", "state.json", "memory-ranges"} {
		if _, err := os.Stat(filepath.Join(snap, f)); err != nil {
			t.Errorf("snapshot: %v", err)
		}
	}
	// Restore needs a fresh VMM; the restored VM comes back paused.
	os.Remove(cfg.Vsock.Socket)
	fresh := startDouble(t, tmp(t))
	resp, err := fresh.c.PutVmRestore(ctx, api.RestoreConfig{SourceUrl: snapURL})
	fresh.check("vm.restore in a fresh VMM", resp, err, 204)
	resp, err = fresh.c.GetVmInfo(ctx)
	var vi api.VmInfo
	json.Unmarshal(fresh.check("vm.info", resp, err, 200), &vi)
	if vi.State != api.Paused {
		t.Errorf("restored VM is %s, want Paused", vi.State)
	}
	resp, err = fresh.c.PutVmRestore(ctx, api.RestoreConfig{SourceUrl: snapURL})
	fresh.check("second vm.restore", resp, err, 500)
}

// TestVirtioFs checks the double's virtio-fs rules: shared memory, a
// device the guest must eject, and no snapshot while one is attached.
func TestVirtioFs(t *testing.T) {
	dir := tmp(t)
	u := startDouble(t, dir)
	ctx := context.Background()
	// What listens on the vhost-user socket stands in for virtiofsd.
	fsSock := filepath.Join(dir, "fs.sock")
	ln, err := net.Listen("unix", fsSock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(io.Discard, c) // until the VMM drops the device
		close(closed)
	}()
	cfg := config(t, dir)
	id := "workspace"
	cfg.Fs = &[]api.FsConfig{{Tag: "workspace", Socket: fsSock, NumQueues: 1, QueueSize: 1024, Id: &id}}
	resp, err := u.c.CreateVM(ctx, cfg)
	u.check("vm.create", resp, err, 204)
	resp, err = u.c.BootVM(ctx)
	if body := u.check("vm.boot without shared memory", resp, err, 500); !bytes.Contains(body, []byte("shared memory")) {
		t.Errorf("vm.boot: %s, want it to say virtio-fs needs shared memory", body)
	}
	resp, err = u.c.DeleteVM(ctx)
	u.check("vm.delete", resp, err, 204)
	shared := true
	cfg.Memory = &api.MemoryConfig{Size: 128 << 20, Shared: &shared}
	resp, err = u.c.CreateVM(ctx, cfg)
	u.check("vm.create", resp, err, 204)
	resp, err = u.c.BootVM(ctx)
	u.check("vm.boot", resp, err, 204)
	resp, err = u.c.PauseVM(ctx)
	u.check("vm.pause", resp, err, 204)
	snapURL := "file://" + dir
	resp, err = u.c.PutVmSnapshot(ctx, api.VmSnapshotConfig{DestinationUrl: &snapURL})
	if body := u.check("vm.snapshot with virtio-fs", resp, err, 500); !bytes.Contains(body, []byte("virtio-fs")) {
		t.Errorf("vm.snapshot: %s, want it to name virtio-fs", body)
	}
	// A paused guest cannot eject: the device stays until it runs.
	resp, err = u.c.PutVmRemoveDevice(ctx, api.VmRemoveDevice{Id: &id})
	u.check("vm.remove-device", resp, err, 204)
	other := "nothing"
	resp, err = u.c.PutVmRemoveDevice(ctx, api.VmRemoveDevice{Id: &other})
	u.check("vm.remove-device of an unknown id", resp, err, 404)
	time.Sleep(100 * time.Millisecond)
	if !u.hasDevice(id) {
		t.Fatalf("device %s left a paused VM", id)
	}
	resp, err = u.c.ResumeVM(ctx)
	u.check("vm.resume", resp, err, 204)
	for deadline := time.Now().Add(5 * time.Second); u.hasDevice(id); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("device %s still in the VM 5s after it resumed", id)
		}
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the vhost-user connection stayed open after the device left")
	}
	resp, err = u.c.PauseVM(ctx)
	u.check("vm.pause", resp, err, 204)
	resp, err = u.c.PutVmSnapshot(ctx, api.VmSnapshotConfig{DestinationUrl: &snapURL})
	u.check("vm.snapshot without virtio-fs", resp, err, 204)
	// Hot-plug into the paused VM, then a duplicate id.
	ln2, _ := net.Listen("unix", fsSock+"2")
	defer ln2.Close()
	fs := api.FsConfig{Tag: "workspace", Socket: fsSock + "2", NumQueues: 1, QueueSize: 1024, Id: &id}
	resp, err = u.c.PutVmAddFs(ctx, fs)
	u.check("vm.add-fs hot", resp, err, 200)
	resp, err = u.c.PutVmAddFs(ctx, fs)
	u.check("vm.add-fs of a duplicate id", resp, err, 409)
}

func (u *vmmUnderTest) hasDevice(id string) bool {
	u.t.Helper()
	resp, err := u.c.GetVmInfo(context.Background())
	var vi api.VmInfo
	json.Unmarshal(u.check("vm.info", resp, err, 200), &vi)
	if vi.DeviceTree == nil {
		return false
	}
	_, ok := (*vi.DeviceTree)[id]
	return ok
}

// TestVsockHandshake checks the host side of the vsock device: CONNECT
// to the agent's port is answered OK and joined to the agent; any other
// port is closed.
func TestVsockHandshake(t *testing.T) {
	dir := tmp(t)
	u := startDouble(t, dir)
	ctx := context.Background()
	cfg := config(t, dir)
	resp, err := u.c.CreateVM(ctx, cfg)
	u.check("vm.create", resp, err, 204)
	resp, err = u.c.BootVM(ctx)
	u.check("vm.boot", resp, err, 204)
	dial := func(line string) (string, error) {
		c, err := net.Dial("unix", cfg.Vsock.Socket)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, line)
		b, err := io.ReadAll(io.LimitReader(c, 64))
		if len(b) > 0 {
			return string(b), nil
		}
		return "", err
	}
	if got, _ := dial("CONNECT 1025\n"); got != "" {
		t.Errorf("CONNECT to a port nobody listens on answered %q, want the connection closed", got)
	}
	if got, _ := dial("HELLO\n"); got != "" {
		t.Errorf("a line that is not CONNECT answered %q, want the connection closed", got)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.Dial("unix", cfg.Vsock.Socket)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(2 * time.Second))
		io.WriteString(c, "connect 1024\n")
		buf := make([]byte, 32)
		n, _ := c.Read(buf)
		c.Close()
		if strings.HasPrefix(string(buf[:n]), "OK ") && strings.HasSuffix(string(buf[:n]), "\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CONNECT 1024 never answered OK (last: %q)", buf[:n])
		}
	}
}
