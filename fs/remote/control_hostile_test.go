package remote

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"hearth/fs"
)

// TestHostileControlChannelScope: a session view's connection cannot ask
// for the control channel, and a control connection gets no SFTP.
func TestHostileControlChannelScope(t *testing.T) {
	tb := newTestbed(t, "alpha")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	view, err := tb.node("alpha").dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	sess, err := view.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.RequestSubsystem(subsystemControl); err == nil {
		t.Error("a view user got the control subsystem")
	}
	ctl, err := dialAs(ctx, tb.node(""), ControlUser)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	for _, sub := range []string{subsystemSFTP, subsystemEvents} {
		s, err := ctl.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RequestSubsystem(sub); err == nil {
			t.Errorf("the control user got subsystem %s", sub)
		}
		s.Close()
	}
}

// TestHostileControlRequests: paths that climb, are absolute, cross a
// symbolic link or name another kind of thing are refused at the serving
// node, and change nothing.
func TestHostileControlRequests(t *testing.T) {
	tb := newTestbed(t, "alpha", "beta")
	if err := tb.write("beta", "outputs/r.md", "beta's"); err != nil {
		t.Fatal(err)
	}
	if err := tb.store.Symlink("alpha", "outputs/link", "../../beta/outputs", fs.Owner{}); err != nil {
		t.Fatal(err)
	}
	c := tb.client(t)
	for _, p := range []string{"../beta/outputs/r.md", "outputs/../../beta/outputs/r.md", "/beta/outputs/r.md",
		"/etc/passwd", "outputs/link/r.md", "outputs/\x00x", "", strings.Repeat("a/", fs.MaxPathLen)} {
		if err := c.WriteFile("alpha", p, strings.NewReader("mine"), fs.Owner{}); err == nil {
			t.Errorf("WriteFile(%q) succeeded", p)
		}
		if err := c.RemoveAll("alpha", p); err == nil && p != "outputs/link/r.md" {
			t.Errorf("RemoveAll(%q) succeeded", p)
		}
		if err := c.Chmod("alpha", p, 0o777); err == nil {
			t.Errorf("Chmod(%q) succeeded", p)
		}
		if err := c.MkdirAll("alpha", p, fs.Owner{}); err == nil {
			t.Errorf("MkdirAll(%q) succeeded", p)
		}
		if b, err := c.ReadFile("alpha", p, 1<<20); err == nil {
			t.Errorf("ReadFile(%q) = %q", p, b)
		}
		if err := c.Move("alpha", "outputs", p); err == nil {
			t.Errorf("Move(outputs, %q) succeeded", p)
		}
	}
	if _, err := c.ReadFile("alpha", "outputs/x", MaxRead+1); !errors.Is(err, ErrBadRequest) {
		t.Errorf("ReadFile past MaxRead = %v, want ErrBadRequest", err)
	}
	if err := c.Snapshot("alpha", "s"); err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{"../beta", "beta", "/x", "_node"} {
		if err := c.Branch("alpha", "s", to); err == nil {
			t.Errorf("Branch to %q succeeded", to)
		}
	}
	if err := c.WriteFile("alpha", "outputs/link/r.md", strings.NewReader("x"), fs.Owner{}); !errors.Is(err, fs.ErrSymlinkInPath) {
		t.Errorf("write through a symlink = %v, want fs.ErrSymlinkInPath", err)
	}
	if err := c.Chmod("alpha", "outputs", 0o4777); !errors.Is(err, ErrBadRequest) {
		t.Errorf("Chmod setuid = %v, want ErrBadRequest", err)
	}
	for _, bad := range []string{"../beta", "Beta", "", "_node"} {
		if err := c.Snapshot(bad, "s"); !errors.Is(err, ErrBadRequest) {
			t.Errorf("Snapshot(%q) = %v, want ErrBadRequest", bad, err)
		}
	}
	if got, err := tb.read("beta", "outputs/r.md"); err != nil || got != "beta's" {
		t.Errorf("beta's report is %q, %v", got, err)
	}
	if got, _ := c.Glob("alpha", "outputs/link/*"); len(got) != 0 {
		t.Errorf("Glob through a symlink = %q", got)
	}
}

// TestHostileControlFrames: a frame past its bound is refused before its
// body is read; a write whose data frames are too large leaves no file.
func TestHostileControlFrames(t *testing.T) {
	tb := newTestbed(t, "alpha")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctl, err := dialAs(ctx, tb.node(""), ControlUser)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	send := func(frames ...[]byte) answer {
		t.Helper()
		s, err := ctl.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		in, _ := s.StdinPipe()
		out, _ := s.StdoutPipe()
		if err := s.RequestSubsystem(subsystemControl); err != nil {
			t.Fatal(err)
		}
		go func() {
			for _, f := range frames {
				if _, err := in.Write(f); err != nil {
					return
				}
			}
		}()
		b, err := readFrame(out, maxAnswerFrame)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		var a answer
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	huge := make([]byte, 4)
	binary.BigEndian.PutUint32(huge, 1<<31)
	if a := send(huge); a.Code != "bad_request" || !strings.Contains(a.Err, "too large") {
		t.Errorf("huge request frame: answer %+v", a)
	}
	req := frame([]byte(`{"op":"write","session":"alpha","path":"outputs/x"}`))
	if a := send(req, huge); a.Code != "bad_request" {
		t.Errorf("huge data frame: answer %+v", a)
	}
	if _, err := tb.read("alpha", "outputs/x"); !errors.Is(err, fs.ErrNotFound) {
		t.Errorf("a refused write left outputs/x: %v", err)
	}
	if a := send(frame([]byte(`{"op":"mkdir_all","session":"alpha","path":"a","extra":1}`))); a.Code != "bad_request" {
		t.Errorf("unknown field: answer %+v", a)
	}
}

func frame(b []byte) []byte {
	n := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(n, uint32(len(b)))
	return append(n, b...)
}

// FuzzDecodeRequest: whatever the bytes, the decoder does not panic, and
// what it accepts stays inside its session.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{`{"op":"write","session":"a","path":"outputs/x"}`, `{"op":"glob","session":"a","pattern":"outputs/*.md"}`,
		`{"op":"ensure","session":"a","quota":{"Bytes":1,"Inodes":2}}`, `{"op":"snapshot","session":"a","name":"s1"}`,
		`{"op":"chmod","session":"a","path":"../x","mode":511}`, `{"op":"write","session":"a","path":"/etc/x"}`, `{"op":"read","session":"a","path":"inputs/x","limit":10}`,
		`{"op":"move","session":"a","path":"x","to":"../y"}`, `{"op":"branch","session":"a","name":"s","to":"b"}`,
		`{"op":"restore","session":"a","name":"s"}`, `[]`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := decodeRequest(b)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %v is not ErrBadRequest", err)
			}
			return
		}
		if fs.ValidateID("session", req.Session) != nil {
			t.Fatalf("accepted session %q", req.Session)
		}
		if req.Op == opBranch && fs.ValidateID("session", req.To) != nil {
			t.Fatalf("accepted branch to %q", req.To)
		}
		if req.Op == opRead && (req.Limit <= 0 || req.Limit > MaxRead) {
			t.Fatalf("accepted read limit %d", req.Limit)
		}
		for _, p := range []string{req.Path, req.Pattern, req.To} {
			if strings.HasPrefix(p, "/") || strings.IndexByte(p, 0) >= 0 || strings.Contains("/"+p+"/", "/../") {
				t.Fatalf("accepted path %q", p)
			}
		}
	})
}
