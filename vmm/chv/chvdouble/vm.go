package chvdouble

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"hearth/vmm/chv/api"
)

// vm is the double's one VM. The VMM's mutex guards it.
type vm struct {
	vmm    *VMM
	config api.VmConfig
	state  api.VmState

	// While booted: the device tree (id -> node), the vhost-user
	// connections of virtio-fs devices, devices removed from the config
	// that the guest has not ejected yet, the vsock muxer and the agent.
	devices map[string]api.DeviceNode
	fsConns map[string]net.Conn
	fsTags  map[string]string // virtio-fs device id -> tag
	eject   map[string]bool
	vsock   *muxer
	agent   *agent
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// nextID names a device as upstream does when its config gives no id.
func (m *vm) nextID(prefix string) string {
	id := fmt.Sprintf("_%s%d", prefix, m.vmm.nextDev)
	m.vmm.nextDev++
	return id
}

// check is what upstream refuses when it builds the VM.
func (m *vm) check() error {
	c := &m.config
	kernel, firmware := str(c.Payload.Kernel), str(c.Payload.Firmware)
	if (kernel == "") == (firmware == "") {
		return errors.New("invalid payload: give either a kernel or a firmware")
	}
	for _, f := range []string{kernel, firmware, str(c.Payload.Initramfs)} {
		if f == "" {
			continue
		}
		fh, err := os.Open(f)
		if err != nil {
			return fmt.Errorf("cannot open payload: %w", err)
		}
		fh.Close()
	}
	if c.Cpus != nil && c.Cpus.MaxVcpus < c.Cpus.BootVcpus {
		return fmt.Errorf("max_vcpus %d is below boot_vcpus %d", c.Cpus.MaxVcpus, c.Cpus.BootVcpus)
	}
	if c.Disks != nil {
		for _, d := range *c.Disks {
			if _, err := os.Stat(str(d.Path)); err != nil {
				return fmt.Errorf("cannot open disk: %w", err)
			}
		}
	}
	if c.Fs != nil && len(*c.Fs) > 0 && (c.Memory == nil || c.Memory.Shared == nil || !*c.Memory.Shared) {
		return errors.New("using vhost-user requires using shared memory or huge pages: set memory.shared")
	}
	if c.Vsock != nil {
		if _, err := os.Lstat(c.Vsock.Socket); err == nil {
			return fmt.Errorf("cannot bind vsock socket %s: address in use", c.Vsock.Socket)
		}
	}
	if c.Serial != nil && c.Serial.Mode == "File" && str(c.Serial.File) == "" {
		return errors.New("serial mode File needs a file")
	}
	return nil
}

// start builds the VM from its config and starts it in state (Running,
// or Paused for a restore without resume).
func (m *vm) start(state api.VmState) error {
	if err := m.check(); err != nil {
		return err
	}
	m.devices = map[string]api.DeviceNode{}
	m.fsConns = map[string]net.Conn{}
	m.fsTags = map[string]string{}
	m.eject = map[string]bool{}
	bdf := 1
	add := func(id *string, prefix string) string {
		if id == nil || *id == "" {
			n := m.nextID(prefix)
			*id = n // upstream fills in the ids it picks
		}
		b := fmt.Sprintf("0000:00:%02x.0", bdf)
		bdf++
		m.devices[*id] = api.DeviceNode{Id: id, PciBdf: &b}
		return *id
	}
	c := &m.config
	if c.Disks != nil {
		for i := range *c.Disks {
			d := &(*c.Disks)[i]
			if d.Id == nil {
				d.Id = new(string)
			}
			add(d.Id, "disk")
		}
	}
	if c.Fs != nil {
		for i := range *c.Fs {
			fs := &(*c.Fs)[i]
			if fs.Id == nil {
				fs.Id = new(string)
			}
			if err := m.connectFs(add(fs.Id, "fs"), fs.Socket); err != nil {
				m.stop()
				return err
			}
			m.fsTags[*fs.Id] = fs.Tag
		}
	}
	if c.Vsock != nil {
		if c.Vsock.Id == nil {
			c.Vsock.Id = new(string)
		}
		add(c.Vsock.Id, "vsock")
		mx, err := listenVsock(m, c.Vsock.Socket)
		if err != nil {
			m.stop()
			return err
		}
		m.vsock = mx
	}
	a, err := startAgent(m)
	if err != nil {
		m.stop()
		return err
	}
	m.agent = a
	m.state = state
	if state == api.Paused {
		a.stopTree()
	}
	return nil
}

// connectFs opens the vhost-user connection to virtiofsd and keeps it for
// the device's life: virtiofsd ends when it closes.
func (m *vm) connectFs(id, socket string) error {
	c, err := net.Dial("unix", socket)
	if err != nil {
		return fmt.Errorf("virtio-fs %s: cannot connect to vhost-user socket %s: %w", id, socket, err)
	}
	m.fsConns[id] = c
	return nil
}

// stop ends the agent and every device; the config stays.
func (m *vm) stop() {
	if m.agent != nil {
		m.agent.kill()
		m.agent = nil
	}
	if m.vsock != nil {
		m.vsock.close() // the socket file stays, as upstream leaves it
		m.vsock = nil
	}
	for id, c := range m.fsConns {
		c.Close()
		delete(m.fsConns, id)
	}
	m.devices = nil
}

func (m *vm) pause() error {
	m.agent.stopTree()
	m.state = api.Paused
	return nil
}

func (m *vm) resume() error {
	m.agent.contTree()
	m.state = api.Running
	m.scheduleEject()
	return nil
}

func (m *vm) info() api.VmInfo {
	info := api.VmInfo{Config: m.config, State: m.state}
	if m.devices != nil {
		tree := map[string]api.DeviceNode{}
		for id, n := range m.devices {
			tree[id] = n
		}
		info.DeviceTree = &tree
	}
	size := m.memorySize()
	info.MemoryActualSize = &size
	return info
}

// memorySize is the guest's RAM: upstream's default is 512 MiB.
func (m *vm) memorySize() int64 {
	if m.config.Memory != nil {
		return m.config.Memory.Size
	}
	return 512 << 20
}

func (m *vm) booted() bool { return m.state == api.Running || m.state == api.Paused }

// addFs cold-adds to the config (nil info), or hot-plugs into a booted VM.
func (m *vm) addFs(fs api.FsConfig) (*api.PciDeviceInfo, error) {
	if fs.Id == nil || *fs.Id == "" {
		id := m.nextID("fs")
		fs.Id = &id
	}
	if m.hasID(*fs.Id) {
		return nil, &apiError{http.StatusConflict, []string{"Error from API", "The device could not be added", "duplicate device id " + *fs.Id}}
	}
	if m.booted() {
		if m.config.Memory == nil || m.config.Memory.Shared == nil || !*m.config.Memory.Shared {
			return nil, errors.New("using vhost-user requires using shared memory or huge pages: set memory.shared")
		}
		if err := m.connectFs(*fs.Id, fs.Socket); err != nil {
			return nil, err
		}
		if err := m.plugWorkspace(*fs.Id, fs.Tag); err != nil {
			m.fsConns[*fs.Id].Close()
			delete(m.fsConns, *fs.Id)
			return nil, err
		}
		m.fsTags[*fs.Id] = fs.Tag
		b := fmt.Sprintf("0000:00:%02x.0", 16+len(m.devices))
		m.devices[*fs.Id] = api.DeviceNode{Id: fs.Id, PciBdf: &b}
	}
	list := []api.FsConfig{}
	if m.config.Fs != nil {
		list = *m.config.Fs
	}
	list = append(list, fs)
	m.config.Fs = &list
	if !m.booted() {
		return nil, nil
	}
	return &api.PciDeviceInfo{Id: *fs.Id, Bdf: *m.devices[*fs.Id].PciBdf}, nil
}

func (m *vm) hasID(id string) bool {
	if _, ok := m.devices[id]; ok {
		return true
	}
	c := m.config
	if c.Fs != nil {
		for _, f := range *c.Fs {
			if str(f.Id) == id {
				return true
			}
		}
	}
	if c.Disks != nil {
		for _, d := range *c.Disks {
			if str(d.Id) == id {
				return true
			}
		}
	}
	return c.Vsock != nil && str(c.Vsock.Id) == id
}

// removeDevice drops the device from the config at once; the device
// leaves a booted VM when the guest ejects it, which only a running guest
// does (upstream signals it through ACPI).
func (m *vm) removeDevice(id string) error {
	c := &m.config
	found := false
	if c.Fs != nil {
		var kept []api.FsConfig
		for _, f := range *c.Fs {
			if str(f.Id) == id {
				found = true
				continue
			}
			kept = append(kept, f)
		}
		c.Fs = &kept
	}
	if c.Disks != nil {
		var kept []api.DiskConfig
		for _, d := range *c.Disks {
			if str(d.Id) == id {
				found = true
				continue
			}
			kept = append(kept, d)
		}
		c.Disks = &kept
	}
	if !found {
		return &apiError{http.StatusNotFound, []string{"Error from API", "The device could not be removed", "no device with id " + id}}
	}
	if m.booted() {
		m.eject[id] = true
		m.scheduleEject()
	}
	return nil
}

// scheduleEject lets a running guest eject the devices it was asked to
// give up, a moment later.
func (m *vm) scheduleEject() {
	if len(m.eject) == 0 {
		return
	}
	time.AfterFunc(20*time.Millisecond, func() {
		m.vmm.mu.Lock()
		defer m.vmm.mu.Unlock()
		if m.vmm.vm != m || m.state != api.Running {
			return
		}
		for id := range m.eject {
			delete(m.devices, id)
			if c, ok := m.fsConns[id]; ok {
				c.Close()
				delete(m.fsConns, id)
				m.unplugWorkspace(m.fsTags[id])
				delete(m.fsTags, id)
			}
			delete(m.eject, id)
		}
	})
}

// snapshot writes what upstream writes, refusing a VM with a virtio-fs
// device (see the package doc).
func (m *vm) snapshot(url string) error {
	dir, err := fileURL(url)
	if err != nil {
		return err
	}
	for id := range m.fsConns {
		return fmt.Errorf("virtio-fs device %s cannot be snapshotted: virtiofsd keeps no migratable state, so a restored guest would hang (upstream issues #4994, #6931); remove the device first", id)
	}
	cfg, err := json.MarshalIndent(m.config, "", "  ")
	if err != nil {
		return err
	}
	state, _ := json.Marshal(map[string]any{"double": Version, "note": "a test double: no device or vCPU state"})
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "state.json"), state, 0o600); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "memory-ranges"))
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Truncate(m.memorySize())
}

// guestArgs reads what the guest agent takes from the kernel command
// line, and the virtio-fs tag of its workspace (hearth.fs).
func guestArgs(cmdline string) (port uint32, uid, gid, fsTag string, err error) {
	uid, gid = "0", "0"
	for _, f := range strings.Fields(cmdline) {
		k, val, _ := strings.Cut(f, "=")
		switch k {
		case "hearth.channel":
			p, ok := strings.CutPrefix(val, "vsock-listen:")
			n, perr := strconv.ParseUint(p, 10, 32)
			if !ok || perr != nil {
				return 0, "", "", "", fmt.Errorf("hearth.channel=%s: the double serves only vsock-listen:PORT", val)
			}
			port = uint32(n)
		case "hearth.uid":
			uid = val
		case "hearth.gid":
			gid = val
		case "hearth.fs":
			fsTag = val
		}
	}
	if port == 0 {
		return 0, "", "", "", errors.New("kernel command line has no hearth.channel=vsock-listen:PORT: the guest agent would not be reachable")
	}
	return port, uid, gid, fsTag, nil
}
