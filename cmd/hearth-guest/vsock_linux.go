package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// listenVsock listens on an AF_VSOCK port of the guest, for any host:
// the channel Cloud Hypervisor's vsock device carries (the host side is
// its unix socket with CONNECT <port>).
func listenVsock(spec string) (net.Listener, error) {
	port, err := strconv.ParseUint(spec, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("channel vsock-listen:%s: want a port number", spec)
	}
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("vsock socket: %w (is the vsock driver, vmw_vsock_virtio_transport, loaded?)", err)
	}
	err = unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: uint32(port)})
	if err == nil {
		err = unix.Listen(fd, 16)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock listen on port %d: %w", port, err)
	}
	return &vsockListener{f: os.NewFile(uintptr(fd), "vsock-listener"), port: uint32(port)}, nil
}

// vsockListener is a net.Listener on an AF_VSOCK socket, which package net
// does not know. Its descriptors are non-blocking, so the runtime's poller
// waits for them and Close wakes a blocked Accept.
type vsockListener struct {
	f    *os.File
	port uint32
}

func (l *vsockListener) Accept() (net.Conn, error) {
	rc, err := l.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var nfd int
	var sa unix.Sockaddr
	var aerr error
	err = rc.Read(func(fd uintptr) bool {
		nfd, sa, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		return !errors.Is(aerr, unix.EAGAIN)
	})
	if err != nil {
		return nil, err
	}
	if aerr != nil {
		return nil, fmt.Errorf("vsock accept: %w", aerr)
	}
	remote := vsockAddr{}
	if vm, ok := sa.(*unix.SockaddrVM); ok {
		remote = vsockAddr{cid: vm.CID, port: vm.Port}
	}
	return &vsockConn{File: os.NewFile(uintptr(nfd), "vsock"), local: vsockAddr{cid: unix.VMADDR_CID_ANY, port: l.port}, remote: remote}, nil
}

func (l *vsockListener) Close() error   { return l.f.Close() }
func (l *vsockListener) Addr() net.Addr { return vsockAddr{cid: unix.VMADDR_CID_ANY, port: l.port} }

// vsockConn is one accepted vsock stream.
type vsockConn struct {
	*os.File
	local, remote vsockAddr
}

func (c *vsockConn) LocalAddr() net.Addr  { return c.local }
func (c *vsockConn) RemoteAddr() net.Addr { return c.remote }

func (c *vsockConn) SetDeadline(t time.Time) error      { return c.File.SetDeadline(t) }
func (c *vsockConn) SetReadDeadline(t time.Time) error  { return c.File.SetReadDeadline(t) }
func (c *vsockConn) SetWriteDeadline(t time.Time) error { return c.File.SetWriteDeadline(t) }

type vsockAddr struct{ cid, port uint32 }

func (a vsockAddr) Network() string { return "vsock" }
func (a vsockAddr) String() string  { return fmt.Sprintf("vsock:%d:%d", a.cid, a.port) }
