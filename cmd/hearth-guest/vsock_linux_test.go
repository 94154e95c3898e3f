package main

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestVsockListenBadPort(t *testing.T) {
	for _, spec := range []string{"", "x", "-1", "4294967296"} {
		if _, err := listener("vsock-listen:" + spec); err == nil || !strings.Contains(err.Error(), "port") {
			t.Errorf("listener(vsock-listen:%s) = %v, want an error asking for a port number", spec, err)
		}
	}
}

// vsockListen listens on a free vsock port, skipping where the host
// kernel has no vsock.
func vsockListen(t *testing.T) net.Listener {
	t.Helper()
	for port := 40000 + time.Now().Nanosecond()%10000; ; port++ {
		ln, err := listener("vsock-listen:" + strconv.Itoa(port))
		if err == nil {
			return ln
		}
		if !errors.Is(err, unix.EADDRINUSE) {
			t.Skipf("this host cannot open AF_VSOCK sockets: %v", err)
		}
	}
}

// Close wakes an Accept that waits: the poller, not a blocked thread,
// waits for the listening socket.
func TestVsockCloseWakesAccept(t *testing.T) {
	ln := vsockListen(t)
	if got := ln.Addr().Network(); got != "vsock" {
		t.Errorf("Addr().Network() = %q, want vsock", got)
	}
	errc := make(chan error, 1)
	go func() { _, err := ln.Accept(); errc <- err }()
	time.Sleep(50 * time.Millisecond)
	ln.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Error("Accept after Close = nil error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept still blocked 5s after Close")
	}
}

// A host connects over the loopback transport and the stream works both
// ways.
func TestVsockAcceptStream(t *testing.T) {
	ln := vsockListen(t)
	defer ln.Close()
	port := ln.Addr().(vsockAddr).port
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 2})
	if err := unix.Connect(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_LOCAL, Port: port}); err != nil {
		t.Skipf("this host kernel has no vsock loopback transport (vsock_loopback), so nothing can connect here: %v", err)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("Accept = %v", err)
	}
	defer c.Close()
	unix.Write(fd, []byte("ping"))
	buf := make([]byte, 4)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf); err != nil || string(buf) != "ping" {
		t.Errorf("Read = %q, %v; want ping", buf, err)
	}
}
