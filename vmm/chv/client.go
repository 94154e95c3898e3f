package chv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"hearth/vmm/chv/api"
)

// APIError is a call Cloud Hypervisor answered with an error status. Its
// body is upstream's error chain, a JSON array of strings.
type APIError struct {
	Call    string // e.g. "vm.boot"
	Status  int
	Message []string
}

func (e *APIError) Error() string {
	msg := strings.Join(e.Message, ": ")
	if msg == "" {
		msg = "no error body"
	}
	return fmt.Sprintf("cloud-hypervisor %s: %d %s: %s", e.Call, e.Status, http.StatusText(e.Status), msg)
}

// callTimeout bounds one API call: every call but a snapshot or restore
// (which copy guest memory) answers at once.
const callTimeout = 10 * time.Second

// client wraps the generated client: one VMM's API socket, a timeout per
// call, and errors that name the call.
type client struct {
	api  *api.Client
	sock string
}

func newClient(sock string) *client {
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		// Go does not retry a PUT on a kept-alive connection the VMM
		// closed; a local socket costs nothing to dial again.
		DisableKeepAlives: true,
	}}
	c, err := api.NewClient("http://localhost/api/v1", api.WithHTTPClient(hc))
	if err != nil {
		panic(err) // only a bad server URL fails, and this one is fixed
	}
	return &client{api: c, sock: sock}
}

// do runs one call and checks its status; out, if not nil, gets a 200
// body.
func (c *client) do(ctx context.Context, call string, timeout time.Duration, fn func(context.Context) (*http.Response, error), out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := fn(ctx)
	if err != nil {
		return fmt.Errorf("cloud-hypervisor %s on %s: %w", call, c.sock, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("cloud-hypervisor %s: read answer: %w", call, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &APIError{Call: call, Status: resp.StatusCode}
		if json.Unmarshal(body, &e.Message) != nil && len(body) > 0 {
			e.Message = []string{strings.TrimSpace(string(body))}
		}
		return e
	}
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("cloud-hypervisor %s: answer is not what the API document says: %w", call, err)
		}
	}
	return nil
}

func (c *client) ping(ctx context.Context) (api.VmmPingResponse, error) {
	var out api.VmmPingResponse
	err := c.do(ctx, "vmm.ping", callTimeout, func(ctx context.Context) (*http.Response, error) { return c.api.GetVmmPing(ctx) }, &out)
	return out, err
}

func (c *client) info(ctx context.Context) (api.VmInfo, error) {
	var out api.VmInfo
	err := c.do(ctx, "vm.info", callTimeout, func(ctx context.Context) (*http.Response, error) { return c.api.GetVmInfo(ctx) }, &out)
	return out, err
}

func (c *client) create(ctx context.Context, cfg api.VmConfig) error {
	return c.do(ctx, "vm.create", callTimeout, func(ctx context.Context) (*http.Response, error) { return c.api.CreateVM(ctx, cfg) }, nil)
}

// put runs a call with no body and no answer.
func (c *client) put(ctx context.Context, call string) error {
	calls := map[string]func(context.Context, ...api.RequestEditorFn) (*http.Response, error){
		"vm.boot": c.api.BootVM, "vm.pause": c.api.PauseVM, "vm.resume": c.api.ResumeVM,
		"vm.shutdown": c.api.ShutdownVM, "vm.delete": c.api.DeleteVM, "vmm.shutdown": c.api.ShutdownVMM,
	}
	fn, ok := calls[call]
	if !ok {
		return fmt.Errorf("cloud-hypervisor: no call %s", call)
	}
	return c.do(ctx, call, callTimeout, func(ctx context.Context) (*http.Response, error) { return fn(ctx) }, nil)
}

// addFs adds a virtio-fs device. virtiofsd's socket exists from its
// bind, a moment before it listens: a VMM that connects in between is
// refused ("cannot connect to vhost-user socket"), so that answer is
// tried again for a second before it is the error.
func (c *client) addFs(ctx context.Context, fs api.FsConfig) error {
	deadline := time.Now().Add(time.Second)
	for {
		err := c.do(ctx, "vm.add-fs", callTimeout, func(ctx context.Context) (*http.Response, error) { return c.api.PutVmAddFs(ctx, fs) }, nil)
		if err == nil || !strings.Contains(err.Error(), "cannot connect to vhost-user socket") || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *client) removeDevice(ctx context.Context, id string) error {
	return c.do(ctx, "vm.remove-device", callTimeout, func(ctx context.Context) (*http.Response, error) {
		return c.api.PutVmRemoveDevice(ctx, api.VmRemoveDevice{Id: &id})
	}, nil)
}

// snapshot and restore copy guest memory: they get minutes, not seconds.
func (c *client) snapshot(ctx context.Context, dir string) error {
	url := "file://" + dir
	return c.do(ctx, "vm.snapshot", 10*time.Minute, func(ctx context.Context) (*http.Response, error) {
		return c.api.PutVmSnapshot(ctx, api.VmSnapshotConfig{DestinationUrl: &url})
	}, nil)
}

func (c *client) restore(ctx context.Context, dir string) error {
	resume := true
	return c.do(ctx, "vm.restore", 10*time.Minute, func(ctx context.Context) (*http.Response, error) {
		return c.api.PutVmRestore(ctx, api.RestoreConfig{SourceUrl: "file://" + dir, Resume: &resume})
	}, nil)
}

// isStatus reports whether err is an API answer with one of the codes.
func isStatus(err error, codes ...int) bool {
	var e *APIError
	if !errors.As(err, &e) {
		return false
	}
	for _, c := range codes {
		if e.Status == c {
			return true
		}
	}
	return false
}
