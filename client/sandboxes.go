package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"hearth/appliance/api"
)

// Sandboxes lists the sandboxes, oldest first.
func (c *Client) Sandboxes(ctx context.Context) ([]Sandbox, error) {
	var out []Sandbox
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ListSandboxes(ctx) })
}

// Sandbox describes one sandbox.
func (c *Client) Sandbox(ctx context.Context, id string) (Sandbox, error) {
	var out Sandbox
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.GetSandbox(ctx, id) })
}

// CreateSandbox boots a sandbox and returns it running.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest) (Sandbox, error) {
	var out Sandbox
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.CreateSandbox(ctx, req) })
}

// DestroySandbox kills a sandbox; its workspace session stays.
func (c *Client) DestroySandbox(ctx context.Context, id string) error {
	return c.call(ctx, nil, func(ctx context.Context) (*http.Response, error) { return c.api.DestroySandbox(ctx, id) })
}

// PauseSandbox freezes a sandbox until ResumeSandbox.
func (c *Client) PauseSandbox(ctx context.Context, id string) (Sandbox, error) {
	var out Sandbox
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.PauseSandbox(ctx, id) })
}

// ResumeSandbox thaws a paused sandbox.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (Sandbox, error) {
	var out Sandbox
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ResumeSandbox(ctx, id) })
}

// Exec runs a command in a sandbox to its end, copying its output to
// stdout and stderr as it arrives. Only ctx bounds it (and the exec's own
// timeout, which the daemon applies); cancelling ctx kills the command.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (ExitStatus, error) {
	fail := ExitStatus{Code: -1}
	ctx, cancel := context.WithCancel(ctx) // also ends the read of the stream's tail (drainTail)
	defer cancel()
	resp, err := c.send(ctx, func(ctx context.Context) (*http.Response, error) { return c.api.ExecSandbox(ctx, id, req) })
	if err != nil {
		return fail, err
	}
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	dec := json.NewDecoder(br)
	for {
		var f api.ExecFrame
		if err := dec.Decode(&f); err != nil {
			var syntax *json.SyntaxError
			if errors.As(err, &syntax) {
				return fail, fmt.Errorf("exec in sandbox %s: broken output stream: %w", id, err)
			}
			// The connection ended mid-stream: the daemon went away, and
			// the command (bound to this request) ended with it.
			return fail, fmt.Errorf("exec in sandbox %s: %w: it went away before the command ended, and the command was stopped with it (%v); start it again with 'hearth up' and check 'hearth sandboxes ls'",
				id, ErrDaemonDown, err)
		}
		switch {
		case f.Exit != nil:
			drainTail(br, cancel)
			return *f.Exit, nil
		case f.Error != nil:
			drainTail(br, cancel)
			return fail, &APIError{Code: f.Error.Code, Message: f.Error.Message, Status: resp.StatusCode}
		case f.Stream == api.ExecFrameStreamStdout && stdout != nil:
			if _, err := stdout.Write(f.Data); err != nil {
				return fail, err
			}
		case f.Stream == api.ExecFrameStreamStderr && stderr != nil:
			stderr.Write(f.Data)
		}
	}
}

// What is read of a stream after its last frame: at most maxStreamTail
// bytes, for at most maxTailWait.
const (
	maxStreamTail = 4 << 10
	maxTailWait   = time.Second
)

// drainTail reads a stream's body to its end after its last frame (the
// daemon ends it right after), so that the transport keeps the
// connection for the next request: closed early, a body takes its
// connection with it, and the next call dials again (a new connection,
// and a new goroutine on each side). A tail longer than maxStreamTail,
// or not ended within maxTailWait (cancel, the request's, cuts the read
// short), is not the daemon's: the connection is dropped.
func drainTail(r io.Reader, cancel context.CancelFunc) {
	t := time.AfterFunc(maxTailWait, cancel)
	defer t.Stop()
	io.Copy(io.Discard, io.LimitReader(r, maxStreamTail))
}

// Upload writes r to path in a sandbox with mode (permission bits).
func (c *Client) Upload(ctx context.Context, id, path string, r io.Reader, mode uint32) (int64, error) {
	params := &api.UploadSandboxFileParams{Path: path, Mode: strconv.FormatUint(uint64(mode), 8)}
	resp, err := c.send(ctx, func(ctx context.Context) (*http.Response, error) {
		return c.api.UploadSandboxFileWithBody(ctx, id, params, "application/octet-stream", r)
	})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out api.FileWritten
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("upload %s to sandbox %s: answer: %w", path, id, err)
	}
	return out.Size, nil
}

// Download copies the file at path in a sandbox to w and returns its size
// and mode.
func (c *Client) Download(ctx context.Context, id, path string, w io.Writer) (int64, uint32, error) {
	resp, err := c.send(ctx, func(ctx context.Context) (*http.Response, error) {
		return c.api.DownloadSandboxFile(ctx, id, &api.DownloadSandboxFileParams{Path: path})
	})
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	mode, _ := strconv.ParseUint(resp.Header.Get("X-File-Mode"), 8, 32)
	n, err := io.Copy(w, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("download %s from sandbox %s: got %d of %d bytes", path, id, n, resp.ContentLength)
	}
	return n, uint32(mode), err
}

// Stat describes the file at path in a sandbox.
func (c *Client) Stat(ctx context.Context, id, path string) (FileInfo, error) {
	var out FileInfo
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.StatSandboxFile(ctx, id, &api.StatSandboxFileParams{Path: path})
	})
}

// List lists the directory at path in a sandbox.
func (c *Client) List(ctx context.Context, id, path string) ([]FileInfo, error) {
	var out []FileInfo
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.ListSandboxDir(ctx, id, &api.ListSandboxDirParams{Path: path})
	})
}
