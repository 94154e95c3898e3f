package remote

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pkg/sftp"
)

// sftpClient speaks SFTP as a node holding an authorized key but acting
// as it likes: the SFTP requests are the attacker's, not sshfs's.
func sftpClient(t *testing.T, tb *testbed, session string) *sftp.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := tb.node(session).dial(ctx)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	sc, err := sftp.NewClient(c)
	if err != nil {
		t.Fatalf("sftp.NewClient: %v", err)
	}
	t.Cleanup(func() { sc.Close() })
	return sc
}

func readAll(sc *sftp.Client, p string) (string, error) {
	f, err := sc.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	return string(b), err
}

// TestHostileSFTPPaths: a node's SFTP requests stay inside the session's
// view, whatever the path or symlink says.
func TestHostileSFTPPaths(t *testing.T) {
	tb := newTestbed(t, "alpha", "beta")
	if err := tb.write("beta", ".home/secret", "beta's secret"); err != nil {
		t.Fatal(err)
	}
	if err := tb.write("beta", "outputs/report.md", "beta's report"); err != nil {
		t.Fatal(err)
	}
	sc := sftpClient(t, tb, "alpha")
	host, _ := os.ReadFile("/etc/hostname")

	for _, p := range []string{"../../../../etc/hostname", "/../etc/hostname", "alpha/../../etc/hostname",
		"beta/.home/secret", "/beta/./.home/secret", "alpha/\x00/../etc/hostname"} {
		if got, err := readAll(sc, p); err == nil {
			t.Errorf("read %q = %q, want refused", p, got)
		}
	}
	links := map[string]string{
		"alpha/outputs/abs":   "/etc",
		"alpha/outputs/up":    "../../../../../../etc",
		"alpha/outputs/home":  "../../beta/.home",
		"alpha/outputs/self":  "/proc/self/root/etc",
		"alpha/outputs/store": tb.dir,
	}
	for link, target := range links {
		if err := sc.Symlink(target, link); err != nil {
			t.Fatalf("Symlink(%q, %q) = %v (a symlink is data in the own session)", target, link, err)
		}
		for _, rest := range []string{"hostname", "secret", "passwd", "views"} {
			if got, err := readAll(sc, link+"/"+rest); err == nil {
				t.Errorf("read %s/%s (-> %s) = %q, want refused", link, rest, target, got)
			}
			if f, err := sc.Create(link + "/" + rest + ".new"); err == nil {
				f.Close()
				t.Errorf("create through %s (-> %s) succeeded", link, target)
			}
		}
		if _, err := sc.ReadDir(link); err == nil {
			t.Errorf("ReadDir(%s -> %s) succeeded", link, target)
		}
	}
	if len(host) > 0 {
		if err := sc.Symlink("/etc/hostname", "alpha/outputs/hn"); err != nil {
			t.Fatal(err)
		}
		if got, err := readAll(sc, "alpha/outputs/hn"); err == nil || strings.Contains(got, strings.TrimSpace(string(host))) {
			t.Errorf("read through a link to /etc/hostname = %q, %v; want refused", got, err)
		}
	}
}

// TestHostileSFTPOtherSession: nothing a node does through one session's
// view changes another session.
func TestHostileSFTPOtherSession(t *testing.T) {
	tb := newTestbed(t, "alpha", "beta")
	if err := tb.write("beta", "outputs/report.md", "beta's report"); err != nil {
		t.Fatal(err)
	}
	if err := tb.write("alpha", "outputs/mine", "alpha's"); err != nil {
		t.Fatal(err)
	}
	sc := sftpClient(t, tb, "alpha")
	attacks := map[string]func() error{
		"write": func() error {
			f, err := sc.OpenFile("beta/outputs/report.md", os.O_WRONLY|os.O_TRUNC)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.Write([]byte("pwned"))
			return err
		},
		"create":        func() error { f, err := sc.Create("beta/outputs/new"); closeIf(f); return err },
		"remove":        func() error { return sc.Remove("beta/outputs/report.md") },
		"rename out":    func() error { return sc.PosixRename("beta/outputs/report.md", "alpha/outputs/taken") },
		"rename in":     func() error { return sc.PosixRename("alpha/outputs/mine", "beta/outputs/report.md") },
		"hard link":     func() error { return sc.Link("beta/outputs/report.md", "alpha/outputs/hl") },
		"truncate":      func() error { return sc.Truncate("beta/outputs/report.md", 0) },
		"chmod":         func() error { return sc.Chmod("beta/outputs/report.md", 0o777) },
		"chown":         func() error { return sc.Chown("beta/outputs/report.md", 1234, 1234) },
		"mkdir":         func() error { return sc.Mkdir("beta/inputs/d") },
		"symlink":       func() error { return sc.Symlink("/etc", "beta/outputs/l") },
		"remove tree":   func() error { return sc.RemoveDirectory("beta/inputs") },
		"rename root":   func() error { return sc.PosixRename("beta", "gamma") },
		"remove root":   func() error { return sc.RemoveDirectory("beta") },
		"create at top": func() error { return sc.Mkdir("gamma") },
	}
	for name, attack := range attacks {
		if err := attack(); err == nil {
			t.Errorf("%s in beta's session through alpha's view succeeded", name)
		}
	}
	if got, err := tb.read("beta", "outputs/report.md"); err != nil || got != "beta's report" {
		t.Errorf("beta's report = %q, %v after the attacks", got, err)
	}
	sessions := tb.store.Sessions()
	if len(sessions) != 2 || sessions[1].ID != "beta" {
		t.Errorf("sessions after the attacks = %+v", sessions)
	}
	if err := sc.Remove("beta/outputs/report.md"); !errors.Is(err, os.ErrPermission) {
		t.Errorf("remove in another session = %v, want permission denied", err)
	}
}

func closeIf(f *sftp.File) {
	if f != nil {
		f.Close()
	}
}

// TestHostileSSHRequests: a node key opens SFTP and events, nothing else.
func TestHostileSSHRequests(t *testing.T) {
	tb := newTestbed(t, "alpha")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := tb.node("alpha").dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, cmd := range []string{"id", ""} {
		s, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if cmd == "" {
			err = s.Shell()
		} else {
			err = s.Run(cmd)
		}
		if err == nil {
			t.Errorf("command %q ran", cmd)
		}
		s.Close()
	}
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RequestSubsystem("nosuch"); err == nil {
		t.Errorf("unknown subsystem accepted")
	}
	s.Close()
	if conn, err := c.Dial("tcp", tb.addr); err == nil {
		conn.Close()
		t.Errorf("port forwarding through the workspace server worked")
	}
	if ln, err := c.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
		t.Errorf("remote port forwarding through the workspace server worked")
	}
}
