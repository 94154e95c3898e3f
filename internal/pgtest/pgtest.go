// Package pgtest starts throwaway PostgreSQL servers for tests: Debian's
// postgresql package (scripts/test.sh installs it) run from a fresh
// initdb in a temporary directory, as the postgres user (initdb refuses
// root), with fsync off since nothing outlives the test (a process crash
// still loses nothing committed: the WAL is in the page cache). Each Start is
// its own server, stopped by the test's cleanup, so tests never share
// state or leak a postmaster. With HEARTH_TEST_POSTGRES set to a server's
// URL, Start creates a fresh database there instead.
//
// Only tests import it (cmd/hearth/deps_test.go).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is one running PostgreSQL server.
type Server struct {
	dir  string // data directory and socket directory, owned by postgres
	Host string // the socket directory, or the TCP address's host
	Port int
	// NetNS, when set, is the network namespace (a name for `ip netns
	// exec`) the server runs in.
	NetNS string
}

// Options says how to start a server.
type Options struct {
	// Listen is a TCP address to listen on ("10.9.0.1:5432"); empty
	// serves only the unix socket in the server's directory.
	Listen string
	// NetNS runs the server inside that network namespace; Start makes
	// the database over the server's unix socket, since the namespace's
	// addresses are not reachable from the test process.
	NetNS string
}

const startTimeout = 60 * time.Second

// Start starts a server for t (or, with HEARTH_TEST_POSTGRES, picks a
// fresh database on that one) and returns the URL of an empty database
// named hearth on it. It skips t when PostgreSQL is not installed.
func Start(t testing.TB, opts Options) (*Server, string) {
	t.Helper()
	if ext := os.Getenv("HEARTH_TEST_POSTGRES"); ext != "" && opts.Listen == "" && opts.NetNS == "" {
		return nil, freshDatabase(t, ext, "")
	}
	bin, err := binDir()
	if err != nil {
		t.Skipf("PostgreSQL server: %v (apt-get install postgresql; scripts/test.sh does)", err)
	}
	pg, err := user.Lookup("postgres")
	if err != nil {
		t.Skipf("PostgreSQL server: no postgres user (apt-get install postgresql makes it): %v", err)
	}
	uid, _ := strconv.Atoi(pg.Uid)
	gid, _ := strconv.Atoi(pg.Gid)
	dir, err := os.MkdirTemp("", "hearth-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	s := &Server{dir: dir, Host: dir, Port: 5432, NetNS: opts.NetNS}
	listen := "''"
	if opts.Listen != "" {
		host, port, err := net.SplitHostPort(opts.Listen)
		if err != nil {
			t.Fatalf("pgtest: Listen %q: %v", opts.Listen, err)
		}
		s.Host, listen = host, host
		if s.Port, err = strconv.Atoi(port); err != nil {
			t.Fatalf("pgtest: Listen %q: %v", opts.Listen, err)
		}
	}
	data := filepath.Join(dir, "data")
	asPostgres := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C.UTF-8", "HOME=" + dir}
		return cmd
	}
	if s.NetNS != "" {
		// ip netns exec must run as root; it runs the server as postgres
		// through runuser.
		asPostgres = func(name string, args ...string) *exec.Cmd {
			all := append([]string{"netns", "exec", s.NetNS, "runuser", "-u", "postgres", "--", filepath.Join(bin, name)}, args...)
			cmd := exec.Command("ip", all...)
			cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C.UTF-8", "HOME=" + dir}
			return cmd
		}
	}
	if out, err := asPostgres("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	conf := fmt.Sprintf("listen_addresses = %s\nport = %d\nunix_socket_directories = '%s'\nfsync = off\nfull_page_writes = off\nmax_connections = 200\n",
		quoteConf(listen), s.Port, dir)
	if opts.Listen != "" {
		if err := appendFile(filepath.Join(data, "pg_hba.conf"), "host all all 0.0.0.0/0 trust\n"); err != nil {
			t.Fatal(err)
		}
	}
	if err := appendFile(filepath.Join(data, "postgresql.conf"), conf); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(dir, "server.log")
	start := asPostgres("pg_ctl", "-D", data, "-l", logFile, "-w", "-t", strconv.Itoa(int(startTimeout/time.Second)), "start")
	if out, err := start.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("pgtest: pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	t.Cleanup(func() {
		// immediate: nothing in a test server is worth a checkpoint.
		if out, err := asPostgres("pg_ctl", "-D", data, "-m", "immediate", "-w", "-t", "30", "stop").CombinedOutput(); err != nil {
			t.Errorf("pgtest: pg_ctl stop: %v\n%s", err, out)
		}
	})
	if s.NetNS == "" {
		return s, freshDatabase(t, s.URL("postgres"), "")
	}
	// The test process is outside the namespace, where the server's
	// address is not reachable: it makes the database over the unix
	// socket, and the URL it returns is for the namespace's own.
	return s, freshDatabase(t, s.socketURL("postgres"), s.URL("postgres"))
}

// Stop stops the server at once (as a crash would: no checkpoint) and
// Restart starts it again on the same data, for tests of what survives a
// database restart.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.pgctl(t, "-m", "immediate", "-w", "-t", "30", "stop")
}

// Restart starts a stopped server again.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.pgctl(t, "-l", filepath.Join(s.dir, "server.log"), "-w", "-t", strconv.Itoa(int(startTimeout/time.Second)), "start")
}

func (s *Server) pgctl(t testing.TB, args ...string) {
	bin, err := binDir()
	if err != nil {
		t.Fatal(err)
	}
	all := append([]string{"-u", "postgres", "--", filepath.Join(bin, "pg_ctl"), "-D", filepath.Join(s.dir, "data")}, args...)
	cmd := exec.Command("runuser", all...)
	if s.NetNS != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", s.NetNS, "runuser"}, all...)...)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: pg_ctl %v: %v\n%s", args, err, out)
	}
}

// URL is the URL of database db on the server.
func (s *Server) URL(db string) string {
	if s.Host == s.dir {
		return s.socketURL(db)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", net.JoinHostPort(s.Host, strconv.Itoa(s.Port)), db)
}

// socketURL is the URL of database db through the server's unix socket.
func (s *Server) socketURL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", db, url.QueryEscape(s.dir), s.Port)
}

// freshDatabase creates a database with a random name on the server at
// base (a URL of any database there), dropped when t ends, and returns
// its URL: base's with the database's name, or, if set, as.
func freshDatabase(t testing.TB, base, as string) string {
	t.Helper()
	if as == "" {
		as = base
	}
	u, err := url.Parse(as)
	if err != nil {
		t.Fatalf("pgtest: server URL %q: %v", base, err)
	}
	var b [4]byte
	rand.Read(b[:])
	name := "hearth_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("pgtest: connect %s: %v", base, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return // the server is gone with the database
		}
		defer conn.Close(ctx)
		conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	u.Path = "/" + name
	return u.String()
}

// binDir is where Debian keeps the newest installed server's programs.
func binDir() (string, error) {
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(m) == 0 {
		return "", fmt.Errorf("no /usr/lib/postgresql/*/bin/pg_ctl")
	}
	return filepath.Dir(m[len(m)-1]), nil
}

func quoteConf(s string) string {
	if s == "''" {
		return s
	}
	return "'" + s + "'"
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
