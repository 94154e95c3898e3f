// Command hearth-guest is the agent that runs inside every machine, in
// every tier, usually as PID 1. It mounts what a process tree needs (when
// it is PID 1), reaps orphans, and serves the host over one byte stream
// with the protocol of package vmm/guest.
//
// In a VM it is /init of the initramfs and reads its settings from the
// kernel command line instead of flags (vm_linux.go).
//
// Usage: hearth-guest --version, or hearth-guest --channel fd:N|unix:PATH|dev:PATH|listen:PATH|listen-fd:N
// [--jail-fd N] [--hostname NAME] [--root DIR]... [--uid N --gid N]
//
// Copied into a machine and run there with --attest, it is the probe that
// attests the machine's isolation (attest_linux.go).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"hearth/internal/version"
	"hearth/vmm/guest"
)

type roots []string

func (r *roots) String() string     { return strings.Join(*r, ",") }
func (r *roots) Set(v string) error { *r = append(*r, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "hearth-guest:", err)
		if os.Getpid() == 1 {
			powerOff()
		}
		os.Exit(1)
	}
	if os.Getpid() == 1 {
		powerOff()
	}
}

func run(args []string) error {
	fl := flag.NewFlagSet("hearth-guest", flag.ContinueOnError)
	channel := fl.String("channel", "fd:3", "the host channel: fd:N, unix:PATH, dev:PATH (a virtio-serial port), or a socket to accept the host on: listen:PATH, listen-fd:N")
	hostname := fl.String("hostname", "", "hostname to set (PID 1 only)")
	uid := fl.Uint("uid", uint(os.Getuid()), "user that runs processes by default")
	gid := fl.Uint("gid", uint(os.Getgid()), "group that runs processes by default")
	jailFD := fl.Int("jail-fd", -1, "set up a jail from the config and mounts sent on this socket first (PID 1 of new namespaces)")
	exeFD := fl.Int("exe-fd", -1, "descriptor of this binary the host exec'd us through; closed at once")
	attachTo := fl.String("attach-workspace", "", "host side: put the detached mount at descriptor 3 at this path inside the machine of --target-pid, replacing what is there, and exit")
	targetPID := fl.Int("target-pid", 0, "the agent whose machine --attach-workspace works on")
	wsDevice := fl.String("workspace-device", "", "outside a VM (the Cloud Hypervisor double): the directory standing for the workspace's virtio-fs device, bound at /workspace/.share again when the host asks for a remount")
	showVersion := fl.Bool("version", false, "print the version, commit and Go version this binary was built with, and exit")
	var allowed roots
	fl.Var(&allowed, "root", "directory file requests may reach (repeatable; default /)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		_, err := fmt.Println("hearth-guest " + version.Get().String())
		return err
	}
	if *attachTo != "" {
		return attachWorkspace(*targetPID, *attachTo, 3)
	}
	// PID 1 with no channel given is /init of a VM's initramfs: the
	// kernel command line says the rest.
	vm := os.Getpid() == 1 && !flagSet(fl, "channel")
	var vmc vmConfig
	if vm {
		var err error
		if vmc, err = vmInit(); err != nil {
			return err
		}
		*channel, *hostname, *uid, *gid = vmc.channel, vmc.hostname, uint(vmc.uid), uint(vmc.gid)
	}
	// A VM's port is opened at once: the host learns the VM is up when
	// it is.
	var port *os.File
	if path, ok := strings.CutPrefix(*channel, "dev:"); ok && vm {
		var err error
		if port, err = openPort(path); err != nil {
			return err
		}
	}
	if *exeFD >= 0 {
		syscall.Close(*exeFD)
	}
	ln, err := listener(*channel)
	if err != nil {
		return err
	}
	var jailCfg *JailConfig
	if *jailFD >= 0 {
		cfg, fds, err := receiveJail(*jailFD)
		if err != nil {
			return err
		}
		if err := enterJail(cfg, fds); err != nil {
			return err
		}
		jailCfg = cfg
	}
	if os.Getpid() == 1 {
		if *jailFD < 0 {
			if err := initMounts(); err != nil {
				return err
			}
		}
		// Forwarded ports (the model gateway, the egress proxy) listen on
		// the machine's loopback, which a new network namespace or a VM
		// starts with down.
		if *jailFD >= 0 || vm {
			if err := loopbackUp(); err != nil {
				return fmt.Errorf("bring up the loopback interface: %w", err)
			}
		}
	}
	// Mounting the workspace again is left to a helper started now,
	// while the agent may still mount (remount_linux.go).
	remountWorkspace, err := startWorkspaceRemount(vm, *wsDevice)
	if err != nil {
		return err
	}
	// Processes the agent starts may never gain privileges (setuid
	// binaries, file capabilities), nor any capability outside keptCaps.
	// Both are per thread and any thread may fork: every thread does it.
	// Nothing is started from here to the claim, and these calls are the
	// slowest of the setup (one stop-the-world each), so a machine
	// prepared ahead of time makes them before its claim.
	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 {
		return fmt.Errorf("no_new_privs: %w (build hearth-guest with CGO_ENABLED=0)", e)
	}
	if os.Getpid() == 1 {
		if err := dropBoundingSet(); err != nil {
			return err
		}
	}
	// A VM booted ahead of time is ready up to here; the rest waits for
	// the session that takes it.
	var first io.Reader // the session after the claim's handshake
	if vmc.await {
		c, r, err := awaitClaim(port)
		if err != nil {
			return err
		}
		first = r
		*hostname, *uid, *gid = c.Hostname, uint(c.UID), uint(c.GID)
		if c.Time != 0 {
			if err := setClock(time.Unix(0, c.Time)); err != nil {
				return fmt.Errorf("the claim: %w", err)
			}
		}
	}
	opts := guest.ServerOptions{Roots: allowed, DefaultUID: uint32(*uid), DefaultGID: uint32(*gid),
		BaseEnv:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"},
		RemountWorkspace: remountWorkspace}
	if vm {
		opts.SetClock = setClock
	}
	stop := make(chan struct{})
	defer close(stop)
	// A jail prepared ahead of time is ready up to here too. It locks
	// itself down and serves its host before its claim, the host setting
	// its hostname (vmm/jail's claim), so that once claimed it has only
	// /etc/hosts to write before its requests go on.
	if jailCfg != nil && jailCfg.AwaitClaim {
		if ln == nil {
			return errors.New("a prepared jail needs a channel to accept its host on (listen:PATH or listen-fd:N)")
		}
		// The image's /etc/hosts, or ours made now without the
		// hostname, which only the claim brings: then the claim has
		// only the file's content to write, not its copy up the overlay.
		ours, err := placeHosts()
		if err != nil {
			return err
		}
		if err := lockDown(); err != nil {
			return err
		}
		opts.AwaitClaim = true
		srv := guest.NewServer(opts)
		if os.Getpid() == 1 {
			go srv.ReapOrphans(stop)
		}
		served := make(chan error, 1)
		go func() { served <- acceptHosts(ln, srv) }()
		c, err := awaitJailClaim(*jailFD)
		if err != nil {
			return err
		}
		if ours {
			if err := os.WriteFile(hostsPath, []byte(hostsFor(c.Hostname)), 0o644); err != nil {
				return fmt.Errorf("write %s: %w", hostsPath, err)
			}
		}
		srv.Claim(c.UID, c.GID)
		answerJailClaim(*jailFD)
		return <-served
	}
	if *hostname != "" && os.Getpid() == 1 {
		if err := syscall.Sethostname([]byte(*hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
		if err := writeHosts(*hostname); err != nil {
			return err
		}
	}
	if err := lockDown(); err != nil {
		return err
	}
	if ln != nil {
		srv := guest.NewServer(opts)
		if os.Getpid() == 1 {
			go srv.ReapOrphans(stop)
		}
		return acceptHosts(ln, srv)
	}
	if port != nil {
		srv := guest.NewServer(opts)
		go srv.ReapOrphans(stop)
		return servePort(port, srv, first)
	}
	conn, err := openChannel(*channel)
	if err != nil {
		return err
	}
	defer conn.Close()
	srv := guest.NewServer(opts)
	if os.Getpid() == 1 {
		go srv.ReapOrphans(stop)
	}
	err = srv.Serve(conn)
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isSessionEnd(err) {
		return nil // the host hung up: a normal end
	}
	return err
}

// acceptHosts serves the hosts that connect on ln, one at a time: a
// host that restarts connects again.
func acceptHosts(ln net.Listener, srv *guest.Server) error {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		srv.Serve(conn)
		conn.Close()
	}
}

func flagSet(fl *flag.FlagSet, name string) bool {
	set := false
	fl.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func isSessionEnd(err error) bool {
	return err != nil && strings.Contains(err.Error(), "session shutdown")
}

// listener returns the listening socket of a listen:PATH, listen-fd:N or
// vsock-listen:PORT channel, nil for other channels. A listen:PATH socket is made before a
// jail hides the host's paths.
func listener(channel string) (net.Listener, error) {
	if port, ok := strings.CutPrefix(channel, "vsock-listen:"); ok {
		return listenVsock(port)
	}
	if path, ok := strings.CutPrefix(channel, "listen:"); ok {
		os.Remove(path)
		ln, err := net.Listen("unix", path)
		if err == nil {
			os.Chmod(path, 0o600)
		}
		return ln, err
	}
	if n, ok := strings.CutPrefix(channel, "listen-fd:"); ok {
		fd, err := strconv.Atoi(n)
		if err != nil {
			return nil, fmt.Errorf("channel %q: %w", channel, err)
		}
		f := os.NewFile(uintptr(fd), "host-listener")
		defer f.Close()
		ln, err := net.FileListener(f)
		if err != nil {
			return nil, fmt.Errorf("channel %q is not a listening socket: %w", channel, err)
		}
		return ln, nil
	}
	return nil, nil
}

// openChannel opens the byte stream to the host.
func openChannel(spec string) (io.ReadWriteCloser, error) {
	kind, arg, ok := strings.Cut(spec, ":")
	if !ok {
		return nil, fmt.Errorf("channel %q: want fd:N, unix:PATH or dev:PATH", spec)
	}
	switch kind {
	case "fd":
		n, err := strconv.Atoi(arg)
		if err != nil {
			return nil, fmt.Errorf("channel %q: %w", spec, err)
		}
		f := os.NewFile(uintptr(n), "host-channel")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("channel %q is not a socket: %w", spec, err)
		}
		return c, nil
	case "unix":
		return net.Dial("unix", arg)
	case "dev":
		return os.OpenFile(arg, os.O_RDWR, 0)
	}
	return nil, fmt.Errorf("channel %q: unknown kind %q", spec, kind)
}

// lockDown ends the agent's setup: from here on neither the agent nor
// anything it starts needs more than a few capabilities, or mounts,
// namespaces and the other calls the filter refuses. (Outside a machine,
// as in tests, the agent keeps what it was given.)
func lockDown() error {
	if os.Getpid() == 1 {
		if err := dropOwnCapabilities(); err != nil {
			return err
		}
	}
	return applySeccomp()
}

// writeHosts gives a machine whose image has no /etc/hosts (debootstrap
// leaves none) one that names localhost and the machine itself, so that
// "localhost" resolves for the servers and tools an agent runs. An
// image's own file is left alone.
func writeHosts(hostname string) error {
	if !hostsMissing() {
		return nil
	}
	if err := os.WriteFile(hostsPath, []byte(hostsFor(hostname)), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", hostsPath, err)
	}
	return nil
}

const hostsPath = "/etc/hosts"

// hostsMissing reports whether the image has no /etc/hosts but an /etc
// to put one in (not a bare test root).
func hostsMissing() bool {
	if _, err := os.Lstat(hostsPath); err == nil || !errors.Is(err, os.ErrNotExist) {
		return false
	}
	_, err := os.Stat("/etc")
	return err == nil
}

// placeHosts is writeHosts for a machine not named yet (a jail prepared
// ahead of time): it reports whether it wrote the file, which the claim
// then fills in.
func placeHosts() (ours bool, err error) {
	if !hostsMissing() {
		return false, nil
	}
	return true, writeHosts("")
}

// hostsFor is the /etc/hosts of a machine named hostname ("": not yet
// named).
func hostsFor(hostname string) string {
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	if hostname != "" {
		hosts += "127.0.1.1\t" + hostname + "\n"
	}
	return hosts
}
