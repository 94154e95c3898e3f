package appliance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"hearth/fs"
	"hearth/fs/remote"
)

// serveWorkspace serves the workspace to other nodes when the config
// says where (workspace.listen).
func (d *Daemon) serveWorkspace(store *fs.Store) error {
	if d.cfg.Workspace.Listen == "" {
		return nil
	}
	srv, ln, err := listenWorkspace(d.cfg, store, d.log)
	if err != nil {
		return err
	}
	d.wsAddr = ln.Addr().String()
	d.wsID = remote.WorkspaceID(srv.HostKey())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	d.undo.push("workspace server", func() error {
		srv.Close()
		return <-done
	})
	return nil
}

// remoteDialTimeout bounds the first connection to the workspace node.
const remoteDialTimeout = 30 * time.Second

// useRemoteWorkspace connects to the node holding the workspace when the
// config names one (workspace.remote); agents then work there.
func (d *Daemon) useRemoteWorkspace(ctx context.Context) error {
	w := d.cfg.Workspace
	if w.Remote == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, remoteDialTimeout)
	defer cancel()
	c, err := remote.Dial(ctx, remote.ClientConfig{Addr: w.Remote, KeyFile: w.RemoteKey, KnownHosts: w.RemoteKnownHosts})
	if err != nil {
		return fmt.Errorf("workspace.remote = %q: %w (check that that node runs with workspace.listen there, that its node_keys holds %s.pub, and that %s trusts its host key, %s under its state_dir)",
			w.Remote, err, w.RemoteKey, w.RemoteKnownHosts, filepath.Join("workspace-serve", remote.HostKeyFile+".pub"))
	}
	d.wsClient = c
	d.wsID = c.WorkspaceID()
	d.undo.push("workspace client", c.Close)
	d.log.Info("agents work in the workspace of another node", "remote", w.Remote)
	return nil
}

// WorkspaceHere is nil when this daemon holds the workspace, else an
// ErrUnavailable naming the node that does: what the workspace routes
// answer on a node with workspace.remote.
func (d *Daemon) WorkspaceHere(what string) error {
	if d.wsClient == nil {
		return nil
	}
	return errWorkspaceElsewhere(d.wsClient.Addr(), what)
}

// WorkspaceAddr is where the workspace is served to other nodes, "" if
// it is not (workspace.listen).
func (d *Daemon) WorkspaceAddr() string { return d.wsAddr }

func listenWorkspace(cfg Config, store *fs.Store, log *slog.Logger) (*remote.Server, net.Listener, error) {
	srv, err := remote.NewServer(remote.Config{Store: store, Dir: filepath.Join(cfg.StateDir, "workspace-serve"),
		NodeKeys: cfg.Workspace.NodeKeys, Log: log})
	if err != nil {
		return nil, nil, fmt.Errorf("workspace.listen: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Workspace.Listen)
	if err != nil {
		srv.Close()
		return nil, nil, fmt.Errorf("workspace.listen: %w", err)
	}
	log.Info("workspace served to nodes", "listen", ln.Addr().String(), "host_key", filepath.Join(cfg.StateDir, "workspace-serve", remote.HostKeyFile+".pub"))
	return srv, ln, nil
}

// ServeWorkspace holds the workspace store alone, without machines or
// the API, and serves it to nodes on cfg.Workspace.Listen until ctx ends
// (hearth workspace serve). ready, if set, is called once it listens.
func ServeWorkspace(ctx context.Context, cfg Config, log *slog.Logger, ready func(addr string)) error {
	if cfg.Workspace.Listen == "" {
		return errors.New("workspace.listen is not set: give --listen HOST:PORT or set it in the config")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	release, err := holdSocket(cfg)
	if err != nil {
		return err
	}
	defer release()
	store, err := fs.Open(fs.Options{Dir: filepath.Join(cfg.StateDir, "workspace")})
	if err != nil {
		return err
	}
	defer store.Close()
	srv, ln, err := listenWorkspace(cfg, store, log)
	if err != nil {
		return err
	}
	defer srv.Close()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	if ready != nil {
		ready(ln.Addr().String())
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		srv.Close()
		return <-done
	}
}

// holdSocket takes the daemon's API socket, as the daemon does, so that
// the store is never opened by this and a daemon at once (either refuses
// while the other answers there). Connections to it are closed at once:
// the API is not served.
func holdSocket(cfg Config) (func(), error) {
	sock := cfg.SocketPath()
	if c, err := net.DialTimeout("unix", sock, 200*time.Millisecond); err == nil {
		c.Close()
		return nil, fmt.Errorf("a hearth daemon holds the workspace (it answers on %s): set workspace.listen in its config instead, or stop it first", sock)
	}
	os.Remove(sock) // stale socket from a crash
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state_dir: %w", err)
	}
	ln, err := listenPrivate(sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return func() { ln.Close(); <-done; os.Remove(sock) }, nil
}
