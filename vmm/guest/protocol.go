// Package guest is the protocol between the host and the guest agent that
// runs as PID 1 in every machine, whatever the tier: one byte stream (a
// unix socket for the jail, a virtio-serial port or vsock for VMs)
// multiplexed by yamux. The host opens streams that carry HTTP/1.1
// requests to the agent (exec, files, health); the agent opens streams
// back for each connection to a forwarded port.
//
// Server runs inside the machine (cmd/hearth-guest); Client runs on the
// host, inside the vmm drivers. Nothing else imports this package.
package guest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"hearth/internal/duration"
)

// ExecRequest starts a process in the machine.
type ExecRequest struct {
	Argv    []string          `json:"argv"`
	Env     map[string]string `json:"env,omitempty"`
	Dir     string            `json:"dir,omitempty"`
	UID     *uint32           `json:"uid,omitempty"` // default: the agent's own
	GID     *uint32           `json:"gid,omitempty"`
	Stdin   bool              `json:"stdin,omitempty"`   // the request body after the JSON line is stdin
	Timeout Duration          `json:"timeout,omitempty"` // 0: none
	// PTY runs the process on a terminal of Rows x Cols; its output
	// arrives as stdout, and Resize changes the size while it runs.
	PTY  bool   `json:"pty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
}

// Duration is a time.Duration that travels as a string ("1m30s").
type Duration = duration.Duration

// ExitStatus ends an exec stream.
type ExitStatus struct {
	Code     int    `json:"code"`             // -1 when killed by a signal
	Signal   string `json:"signal,omitempty"` // e.g. "killed"
	TimedOut bool   `json:"timed_out,omitempty"`
	Error    string `json:"error,omitempty"` // the process could not start
}

// Frame kinds of an exec response stream.
const (
	FrameStarted byte = 1 // payload: pid, decimal
	FrameStdout  byte = 2
	FrameStderr  byte = 3
	FrameExit    byte = 4 // payload: ExitStatus as JSON
)

const maxFrame = 1 << 20

// writeFrame writes kind, a 4-byte big-endian length and the payload.
func writeFrame(w io.Writer, kind byte, payload []byte) error {
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// readFrame reads one frame. The length prefix comes from the other side
// and is not trusted: one above maxFrame is refused before anything is
// allocated, and the payload buffer grows with the bytes that actually
// arrive, so a header that promises a megabyte and sends nothing costs
// nothing.
func readFrame(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("guest protocol: frame of %d bytes exceeds %d", n, maxFrame)
	}
	var buf bytes.Buffer
	buf.Grow(int(min(n, frameChunk)))
	got, err := io.Copy(&buf, io.LimitReader(r, int64(n)))
	if err != nil {
		return 0, nil, err
	}
	if got < int64(n) {
		return 0, nil, fmt.Errorf("guest protocol: frame of %d bytes ended after %d: %w", n, got, io.ErrUnexpectedEOF)
	}
	return hdr[0], buf.Bytes(), nil
}

// frameChunk is what readFrame reserves up front for a payload.
const frameChunk = 32 << 10

// FileInfo describes a file in the machine.
type FileInfo struct {
	Name    string    `json:"name"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"`
	ModTime time.Time `json:"mod_time"`
	IsDir   bool      `json:"is_dir"`
}

// Health is what the agent reports about the machine.
type Health struct {
	Uptime      Duration `json:"uptime"`
	Load1       float64  `json:"load1"`
	MemTotal    uint64   `json:"mem_total"`
	MemFree     uint64   `json:"mem_available"`
	DiskTotal   uint64   `json:"disk_total"`
	DiskFree    uint64   `json:"disk_free"`
	Processes   int      `json:"processes"`
	AgentPID    int      `json:"agent_pid"`
	AgentIsInit bool     `json:"agent_is_init"`
}

// Forward names the host service a forwarded connection goes to. The agent
// sends it, as one JSON line, first on each stream it opens.
type Forward struct {
	Name string `json:"name"`
}

// Errors the client returns.
var (
	ErrTooLarge = errors.New("file too large")
	ErrNotFound = errors.New("no such file")
	ErrOutside  = errors.New("path outside the machine's allowed roots")
	// ErrNotSupported: the agent has no way to do what was asked.
	ErrNotSupported = errors.New("not supported by this machine's agent")
)

// Error is the body of a failed request.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// CheckPort refuses what cannot be a TCP port: below 1 or above 65535.
func CheckPort(port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("port %d: a TCP port is between 1 and 65535", port)
	}
	return nil
}
