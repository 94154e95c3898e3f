// Package vmmtest is the conformance suite every vmm.Driver must pass, run
// by each driver's own tests with a way to make specs. Only tests import it.
package vmmtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"hearth/vmm"
	"hearth/vmm/guest"
)

// Run runs the suite against d. spec returns a valid spec for a new id.
func Run(t *testing.T, d vmm.Driver, spec func(id string) vmm.Spec) {
	ctx := context.Background()
	create := func(t *testing.T, id string) vmm.Machine {
		t.Helper()
		m, err := d.Create(ctx, spec(id))
		if err != nil {
			t.Fatalf("Create(%s) = %v", id, err)
		}
		t.Cleanup(func() { m.Destroy(ctx) })
		return m
	}
	t.Run("Exec", func(t *testing.T) {
		m := create(t, "conf-exec")
		out, st := sh(t, m, "echo hello; echo oops >&2; exit 7")
		if out != "hello\n" || st.Code != 7 {
			t.Errorf("exec = %q, %+v; want hello and exit 7", out, st)
		}
	})
	t.Run("Dial", func(t *testing.T) {
		// A connection from the host to a port on the machine's loopback:
		// the port is the agent's own forward listener, whose connections
		// come back to an echo service on the host, so no server needs
		// to be in the image.
		m := create(t, "conf-dial")
		gc := m.Guest()
		gc.Serve("echo", func(context.Context) (net.Conn, error) {
			a, b := net.Pipe()
			go func() { io.Copy(b, b); b.Close() }()
			return a, nil
		})
		listen, err := gc.Forward(ctx, "127.0.0.1:0", "echo")
		if err != nil {
			t.Fatalf("Forward = %v", err)
		}
		_, portText, _ := net.SplitHostPort(listen)
		port, _ := strconv.Atoi(portText)
		c, err := gc.Dial(ctx, port)
		if err != nil {
			t.Fatalf("Dial(%d) = %v", port, err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, "ping"); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4)
		if _, err := io.ReadFull(c, got); err != nil || string(got) != "ping" {
			t.Errorf("through the dialled port: %q, %v; want ping back", got, err)
		}
		if _, err := gc.Dial(ctx, 1); err == nil {
			t.Error("Dial(1), where nothing listens, succeeded")
		}
	})
	t.Run("DuplicateID", func(t *testing.T) {
		create(t, "conf-dup")
		if _, err := d.Create(ctx, spec("conf-dup")); !errors.Is(err, vmm.ErrExists) {
			t.Errorf("second Create(conf-dup) = %v, want ErrExists", err)
		}
	})
	t.Run("PauseResume", func(t *testing.T) {
		m := create(t, "conf-pause")
		p, err := m.Guest().Start(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.02; done"}}, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		if err := m.Pause(ctx); err != nil {
			t.Fatalf("Pause = %v", err)
		}
		// A paused machine cannot answer, so the count is read after Resume.
		time.Sleep(300 * time.Millisecond)
		if err := m.Resume(ctx); err != nil {
			t.Fatalf("Resume = %v", err)
		}
		before, _ := sh(t, m, "cat /tmp/count")
		time.Sleep(200 * time.Millisecond)
		after, _ := sh(t, m, "cat /tmp/count")
		if before == after {
			t.Errorf("count did not move after Resume (%q)", before)
		}
		m.Guest().Signal(ctx, p.PID, "KILL")
		p.Wait()
	})
	t.Run("Destroy", func(t *testing.T) {
		m := create(t, "conf-destroy")
		if err := m.Destroy(ctx); err != nil {
			t.Fatalf("Destroy = %v", err)
		}
		select {
		case <-m.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("Done not closed after Destroy")
		}
		if err := m.Destroy(ctx); err != nil {
			t.Errorf("second Destroy = %v, want nil (idempotent)", err)
		}
		ids, _ := d.List(ctx)
		for _, id := range ids {
			if id == "conf-destroy" {
				t.Errorf("List after Destroy still has conf-destroy")
			}
		}
	})
	t.Run("Recover", func(t *testing.T) {
		m := create(t, "conf-recover")
		sh(t, m, "echo kept > /tmp/mark")
		m.Guest().Close() // as a daemon that died would
		r, err := d.Recover(ctx, "conf-recover")
		if err != nil {
			t.Fatalf("Recover = %v", err)
		}
		if out, _ := sh(t, r, "cat /tmp/mark"); out != "kept\n" {
			t.Errorf("after Recover, /tmp/mark = %q, want kept", out)
		}
		// A machine paused when its daemon died comes back paused.
		p := create(t, "conf-recover-paused")
		if err := p.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		p.Guest().Close()
		rp, err := d.Recover(ctx, "conf-recover-paused")
		if err != nil {
			t.Fatalf("Recover(paused) = %v", err)
		}
		if err := rp.Resume(ctx); err != nil {
			t.Fatalf("Resume after Recover = %v", err)
		}
		if out, _ := sh(t, rp, "echo awake"); out != "awake\n" {
			t.Errorf("recovered paused machine after Resume: %q, want awake", out)
		}
		if _, err := d.Recover(ctx, "conf-none"); !errors.Is(err, vmm.ErrNotFound) {
			t.Errorf("Recover(unknown) = %v, want ErrNotFound", err)
		}
	})
	t.Run("Checkpoint", func(t *testing.T) {
		m := create(t, "conf-ckpt")
		c, ok := m.(vmm.Checkpointer)
		if !ok {
			t.Skipf("%s machines cannot checkpoint", d.Name())
		}
		// The workload's home is in the writable layer; /tmp is not.
		sh(t, m, "echo one > /home/agent/note")
		if err := c.Checkpoint(ctx, "first"); err != nil {
			t.Fatalf("Checkpoint = %v", err)
		}
		if err := c.Checkpoint(ctx, "first"); !errors.Is(err, vmm.ErrExists) {
			t.Errorf("second Checkpoint(first) = %v, want ErrExists", err)
		}
		sh(t, m, "echo two > /home/agent/note; echo new > /home/agent/later")
		if err := c.Restore(ctx, "first"); err != nil {
			t.Fatalf("Restore = %v", err)
		}
		if out, _ := sh(t, m, "cat /home/agent/note; ls /home/agent"); out != "one\nnote\n" {
			t.Errorf("after Restore: %q, want the note as checkpointed and nothing later", out)
		}
		select {
		case <-m.Done():
			t.Errorf("Done closed by a Restore")
		default:
		}
		if cps, err := c.Checkpoints(ctx); err != nil || len(cps) != 1 || cps[0].Name != "first" {
			t.Errorf("Checkpoints = %+v, %v; want [first]", cps, err)
		}
		if err := c.DeleteCheckpoint(ctx, "first"); err != nil {
			t.Errorf("DeleteCheckpoint = %v", err)
		}
		if err := c.Restore(ctx, "first"); !errors.Is(err, vmm.ErrNotFound) {
			t.Errorf("Restore(deleted) = %v, want ErrNotFound", err)
		}
		if err := c.Checkpoint(ctx, "../up"); err == nil {
			t.Errorf("Checkpoint(../up) = nil, want a bad-name error")
		}
	})
	t.Run("Fork", func(t *testing.T) { testFork(t, d, spec) })
	t.Run("Export", func(t *testing.T) {
		m := create(t, "conf-export")
		e, ok := m.(vmm.Exporter)
		if !ok {
			t.Skipf("%s machines cannot export their root", d.Name())
		}
		sh(t, m, "echo saved > /home/agent/setup")
		dst := t.TempDir() + "/root"
		if err := e.Export(ctx, dst); err != nil {
			t.Fatalf("Export = %v", err)
		}
		// A machine made from the export starts where this one was.
		s := spec("conf-export-2")
		s.RootFS = dst
		m2, err := d.Create(ctx, s)
		if err != nil {
			t.Fatalf("Create from the export = %v", err)
		}
		defer m2.Destroy(ctx)
		if out, _ := sh(t, m2, "cat /home/agent/setup; stat -c %u /home/agent/setup"); out != "saved\n"+strconv.Itoa(int(s.UID))+"\n" {
			t.Errorf("in a machine made from the export: %q, want saved, owned by %d", out, s.UID)
		}
	})
	t.Run("WorkspaceAttach", func(t *testing.T) {
		// Plain directories stand in for workspace views: what is checked
		// is that the machine's /workspace/agents moves to the new one.
		dirs := [2]string{t.TempDir(), t.TempDir()}
		for _, dir := range dirs {
			os.Chmod(dir, 0o777) // the machine's user writes here
		}
		s := spec("conf-attach")
		s.Workspace = dirs[0]
		m, err := d.Create(ctx, s)
		if err != nil {
			t.Fatalf("Create(conf-attach) with a workspace = %v", err)
		}
		defer m.Destroy(ctx) // before the directories go
		wa, ok := m.(vmm.WorkspaceAttacher)
		if !ok {
			t.Skipf("%s machines cannot take a new workspace view", d.Name())
		}
		sh(t, m, "echo one > /workspace/agents/one")
		if err := wa.AttachWorkspace(ctx, dirs[1]); err != nil {
			t.Fatalf("AttachWorkspace = %v", err)
		}
		if out, _ := sh(t, m, "echo two > /workspace/agents/two; ls /workspace/agents"); out != "two\n" {
			t.Errorf("after AttachWorkspace, /workspace/agents holds %q, want only two", out)
		}
		for i, want := range []string{"one", "two"} {
			if b, err := os.ReadFile(filepath.Join(dirs[i], want)); err != nil || string(b) != want+"\n" {
				t.Errorf("workspace %d has %s as %q, %v; want %s", i, want, b, err, want)
			}
		}
		if _, err := os.Stat(filepath.Join(dirs[0], "two")); err == nil {
			t.Errorf("a write after AttachWorkspace went to the old workspace")
		}
		if err := wa.AttachWorkspace(ctx, filepath.Join(dirs[1], "none")); err == nil {
			t.Errorf("AttachWorkspace(missing directory) = nil, want an error")
		}
	})
}

// Sh runs a shell script in m and returns stdout and the exit status.
func Sh(t testing.TB, m vmm.Machine, script string) (string, guest.ExitStatus) {
	t.Helper()
	return sh(t, m, script)
}

func sh(t testing.TB, m vmm.Machine, script string) (string, guest.ExitStatus) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := m.Guest().Exec(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", script}}, nil, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", script, m.ID(), err)
	}
	if st.Error != "" {
		t.Fatalf("exec %q in %s: %s", script, m.ID(), st.Error)
	}
	return out.String(), st
}
