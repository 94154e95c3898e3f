package chv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// makeDisk makes the machine's writable disk: a sparse ext4 file.
func makeDisk(ctx context.Context, path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("writable disk: %w", err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return fmt.Errorf("writable disk: %w", err)
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-L", "hearth-rw", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("writable disk: mkfs.ext4 %s: %v: %s (Debian package e2fsprogs)", path, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// startVirtiofsd serves the machine's share (the workspace view at
// share/agents) on the machine's vhost-user
// socket. It serves one VMM connection and exits when it closes, so a
// workspace plugged in again needs a new one.
func (m *machine) startVirtiofsd(ctx context.Context) error {
	bin := m.d.cfg.Virtiofsd
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("virtiofsd for the workspace: %w (apt-get install qemu-system-common, or set Virtiofsd)", err)
	}
	m.stopVirtiofsd()
	sock := m.path(fsSock)
	os.Remove(sock)
	p, err := m.spawn("virtiofsd", fsLog, bin, "--socket-path="+sock, "-o", "source="+m.path(shareDir),
		"-o", "cache=auto", "-o", fmt.Sprintf("timeout=%g", entryTimeout.Seconds()))
	if err != nil {
		return err
	}
	m.virtiofsd.Store(p)
	m.st.Virtiofsd = p.pid
	if err := m.saveState(); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if st, err := os.Stat(sock); err == nil && st.Mode()&os.ModeSocket != 0 {
			return nil
		}
		if !p.alive() {
			return fmt.Errorf("virtiofsd exited while starting: %s", m.tail(fsLog))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("virtiofsd made no socket %s within 5s: %s", sock, m.tail(fsLog))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stopVirtiofsd ends the machine's virtiofsd: our child, or the one in
// state.json after a daemon restart (if it is still virtiofsd).
func (m *machine) stopVirtiofsd() {
	if p := m.virtiofsd.Load(); p != nil {
		m.virtiofsd.Store(nil)
		if p.alive() {
			syscall.Kill(p.pid, syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(5 * time.Second):
				syscall.Kill(p.pid, syscall.SIGKILL)
				<-p.exited
			}
		}
		return
	}
	pid := m.st.Virtiofsd
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if pid <= 0 || err != nil || trimDeleted(exe) != m.d.cfg.Virtiofsd {
		return
	}
	syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 50 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
}

// attachFs plugs the workspace into the VM: a new virtiofsd, then
// vm.add-fs (cold into a created VM, hot into a booted one).
func (m *machine) attachFs(ctx context.Context) error {
	if err := m.startVirtiofsd(ctx); err != nil {
		return err
	}
	return m.api.addFs(ctx, m.fsConfig())
}

func trimDeleted(exe string) string { return strings.TrimSuffix(exe, " (deleted)") }

// dialVsock connects to port in the guest through the VMM's vsock unix
// socket: the host writes CONNECT <port>\n and reads OK <n>\n, then the
// stream is the guest's. A port nobody listens on closes the connection.
func dialVsock(ctx context.Context, sock string, port uint32) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(conn, "CONNECT %d\n", port); err != nil {
		conn.Close()
		return nil, fmt.Errorf("vsock CONNECT %d: %w", port, err)
	}
	// One byte at a time: nothing after the line may be read ahead.
	line, err := bufio.NewReaderSize(oneByte{conn}, 16).ReadString('\n')
	if err != nil {
		conn.Close()
		if err == io.EOF {
			return nil, fmt.Errorf("vsock CONNECT %d: closed (nothing listens on the port yet)", port)
		}
		return nil, fmt.Errorf("vsock CONNECT %d: %w", port, err)
	}
	if f := strings.Fields(line); len(f) != 2 || f[0] != "OK" {
		conn.Close()
		return nil, fmt.Errorf("vsock CONNECT %d: answer %q, want OK <port>", port, strings.TrimSpace(line))
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
}

// oneByte reads at most one byte per call, so a bufio.Reader over it
// never holds bytes past what it returned.
type oneByte struct{ r io.Reader }

func (o oneByte) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}
