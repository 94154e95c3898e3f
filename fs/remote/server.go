package remote

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"hearth/fs"
)

// Config says what a Server serves and to whom.
type Config struct {
	// Store is the workspace; the server only mounts views of it.
	Store *fs.Store
	// Dir is the server's state directory: the host key, and the
	// sessions' views mounted while nodes use them.
	Dir string
	// NodeKeys is an authorized_keys file with one key per node, the
	// comment naming the node. It is read again for every connection, so
	// adding or removing a node needs no restart.
	NodeKeys string
	// Log gets one line per connection; nil discards.
	Log *slog.Logger
}

// handshakeTimeout bounds a connection's SSH handshake: a peer that
// never finishes it does not hold a goroutine forever.
const handshakeTimeout = 15 * time.Second

// Subsystems a node may ask for; everything else is refused.
const (
	subsystemSFTP   = "sftp"
	subsystemEvents = "hearth-events@hearth"
)

// ErrUnknownSession means the SSH user names no live session.
var ErrUnknownSession = errors.New("no such session")

// Server serves session views over SFTP on SSH.
type Server struct {
	cfg   Config
	host  ssh.Signer
	views *views
	log   *slog.Logger

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer checks cfg and loads (or makes) the host key.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Dir == "" || cfg.NodeKeys == "" {
		return nil, errors.New("workspace server: Store, Dir and NodeKeys are required")
	}
	if _, err := readNodeKeys(cfg.NodeKeys); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("workspace server state: %w", err)
	}
	host, err := loadHostKey(cfg.Dir)
	if err != nil {
		return nil, err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, host: host, log: log, conns: map[net.Conn]struct{}{},
		views: &views{store: cfg.Store, dir: filepath.Join(cfg.Dir, "views"), m: map[viewUser]*served{}}}, nil
}

// HostKey is the public key nodes must trust (their known_hosts).
func (s *Server) HostKey() ssh.PublicKey { return s.host.PublicKey() }

// Serve accepts connections on ln until Close. It returns nil after Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.ln = ln
	s.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("workspace server: accept: %w", err)
		}
		if !s.track(c) {
			c.Close()
			return nil
		}
		go s.serveConn(c)
	}
}

func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return true
}

// Close stops accepting, drops every connection, waits for their
// handlers and unmounts the views. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	if s.ln != nil {
		s.ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.views.closeAll()
	return nil
}

func (s *Server) config() *ssh.ServerConfig {
	cfg := &ssh.ServerConfig{PublicKeyCallback: s.authorize}
	cfg.AddHostKey(s.host)
	return cfg
}

// authorize lets in an authorized node key whose user is a live session.
func (s *Server) authorize(md ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
	keys, err := readNodeKeys(s.cfg.NodeKeys)
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		if bytes.Equal(k.key.Marshal(), key.Marshal()) {
			if md.User() == ControlUser {
				return &ssh.Permissions{Extensions: map[string]string{"node": k.name, "control": "yes"}}, nil
			}
			u, err := parseUser(md.User())
			if err != nil {
				return nil, err
			}
			if !s.live(u.session) {
				return nil, fmt.Errorf("session %q: %w", u.session, ErrUnknownSession)
			}
			return &ssh.Permissions{Extensions: map[string]string{"node": k.name}}, nil
		}
	}
	return nil, errors.New("key not authorized")
}

func (s *Server) live(session string) bool {
	for _, si := range s.cfg.Store.Sessions() {
		if si.ID == session {
			return true
		}
	}
	return false
}

func (s *Server) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	sc, chans, reqs, err := ssh.NewServerConn(c, s.config())
	if err != nil {
		s.log.Info("workspace node refused", "remote", c.RemoteAddr(), "err", err)
		return
	}
	c.SetDeadline(time.Time{})
	var u viewUser
	control := sc.Permissions.Extensions["control"] == "yes"
	if !control {
		if u, err = parseUser(sc.User()); err != nil { // checked at authorization
			sc.Close()
			return
		}
	}
	s.log.Info("workspace node connected", "node", sc.Permissions.Extensions["node"], "user", sc.User(), "remote", c.RemoteAddr())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ssh.DiscardRequests(reqs) }() // no port forwarding
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.Prohibited, "only sftp and events sessions")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); s.serveChannel(u, control, ch, creqs) }()
	}
	sc.Close()
	wg.Wait()
}

// serveChannel waits for the one subsystem request a channel may make,
// refusing shells, commands and terminals. A node's control connection
// (ControlUser) may ask for the control subsystem only; a session view's
// connection for SFTP and events only.
func (s *Server) serveChannel(u viewUser, control bool, ch ssh.Channel, reqs <-chan *ssh.Request) {
	var wg sync.WaitGroup
	defer wg.Wait() // the requests end with the channel or the connection
	defer ch.Close()
	for req := range reqs {
		name := subsystemName(req)
		allowed := name == subsystemSFTP || name == subsystemEvents
		if control {
			allowed = name == subsystemControl
		}
		if !allowed {
			req.Reply(false, nil)
			continue
		}
		var sub *fs.Subscription
		if name == subsystemEvents && !control {
			// Subscribed before the yes: a node that heard it misses nothing.
			sub = s.cfg.Store.SubscribeSettled(u.session, eventBuffer)
		}
		req.Reply(true, nil)
		wg.Add(1)
		go func() { defer wg.Done(); ssh.DiscardRequests(reqs) }()
		if control {
			s.serveControl(ch)
			return
		}
		if sub != nil {
			s.serveEvents(u.session, sub, ch)
			return
		}
		if err := s.serveSFTP(u, ch); err != nil {
			s.log.Info("workspace sftp ended", "user", u.String(), "err", err)
		}
		return
	}
}

// subsystemName is the subsystem a "subsystem" request asks for, or "".
func subsystemName(req *ssh.Request) string {
	if req.Type != "subsystem" {
		return ""
	}
	var p struct{ Name string }
	if ssh.Unmarshal(req.Payload, &p) != nil {
		return ""
	}
	return p.Name
}

func (s *Server) serveSFTP(u viewUser, ch ssh.Channel) error {
	h, release, err := s.views.acquire(u)
	if err != nil {
		return err
	}
	defer release()
	rs := sftp.NewRequestServer(ch, h.sftp())
	err = rs.Serve()
	rs.Close()
	if errors.Is(err, os.ErrClosed) || err == nil {
		return nil
	}
	return err
}
