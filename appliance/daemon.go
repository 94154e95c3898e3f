package appliance

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"hearth/fs"
)

// Daemon is a running appliance: the store, its host view and the API.
type Daemon struct {
	cfg   Config
	store *fs.Store
	view  *fs.View
	srv   *http.Server
	ln    net.Listener
	log   *log.Logger

	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Start opens the store, mounts the host view and serves the API. A stale
// mount or socket left by a crashed daemon is cleaned up first.
func Start(cfg Config, logger *log.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = log.New(os.Stderr, "hearth: ", log.LstdFlags)
	}
	store, err := fs.Open(fs.Options{Dir: filepath.Join(cfg.StateDir, "workspace")})
	if err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, store: store, log: logger}
	if d.view, err = store.Mount(cfg.Workspace.Mount, fs.ViewOptions{Host: true}); err != nil {
		store.Close()
		return nil, err
	}
	if err := d.listen(); err != nil {
		d.view.Unmount()
		store.Close()
		return nil, err
	}
	return d, nil
}

func (d *Daemon) listen() error {
	sock := d.cfg.SocketPath()
	if c, err := net.DialTimeout("unix", sock, 200*time.Millisecond); err == nil {
		c.Close()
		return fmt.Errorf("another hearth daemon is serving %s: stop it first", sock)
	}
	os.Remove(sock) // stale socket from a crash
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	os.Chmod(sock, 0o600)
	d.ln = ln
	d.srv = &http.Server{Handler: d.routes(), ReadHeaderTimeout: 10 * time.Second}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := d.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Printf("api: %v", err)
		}
	}()
	return nil
}

// Store is the workspace store (for tests and in-process callers).
func (d *Daemon) Store() *fs.Store { return d.store }

// Close stops the API, unmounts the workspace and closes the store.
// Idempotent.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.srv.Shutdown(ctx)
		d.wg.Wait()
		os.Remove(d.cfg.SocketPath())
		err := d.view.Unmount()
		if cerr := d.store.Close(); err == nil {
			err = cerr
		}
		d.closeErr = err
	})
	return d.closeErr
}
