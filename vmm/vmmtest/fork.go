package vmmtest

import (
	"context"
	"path/filepath"
	"testing"

	"hearth/vmm"
)

// testFork: a machine's captured layer seeds new machines with its files
// as they were; afterwards each machine's writes are its own, and the
// source runs on.
func testFork(t *testing.T, d vmm.Driver, spec func(id string) vmm.Spec) {
	ctx := context.Background()
	create := func(s vmm.Spec) vmm.Machine {
		t.Helper()
		m, err := d.Create(ctx, s)
		if err != nil {
			t.Fatalf("Create(%s) = %v", s.ID, err)
		}
		t.Cleanup(func() { m.Destroy(ctx) })
		return m
	}
	src := create(spec("conf-fork"))
	f, ok := src.(vmm.Forker)
	if !ok {
		t.Skipf("%s machines cannot be forked", d.Name())
	}
	sh(t, src, "echo one > /home/agent/note")
	layer := filepath.Join(t.TempDir(), "layer")
	if _, err := f.CaptureLayer(ctx, layer); err != nil {
		t.Fatalf("CaptureLayer = %v", err)
	}
	if _, err := f.CaptureLayer(ctx, layer); err == nil {
		t.Errorf("CaptureLayer onto an existing capture = nil error")
	}
	if out, st := sh(t, src, "echo later > /home/agent/later && cat /home/agent/note"); out != "one\n" || st.Code != 0 {
		t.Fatalf("source after the capture: %q, %+v; want it running with its files", out, st)
	}
	var forks []vmm.Machine
	for i, id := range []string{"conf-fork-a", "conf-fork-b"} {
		s := spec(id)
		s.Layer, s.TakeLayer = layer, i == 1
		m := create(s)
		forks = append(forks, m)
		if out, _ := sh(t, m, "cat /home/agent/note; ls /home/agent; echo "+id+" > /home/agent/own; sync"); out != "one\nnote\n" {
			t.Errorf("fork %s: %q, want the note and nothing later", id, out)
		}
	}
	for _, m := range forks {
		if out, _ := sh(t, m, "cat /home/agent/own"); out != m.ID()+"\n" {
			t.Errorf("fork %s: own = %q, want its own write", m.ID(), out)
		}
	}
	if out, _ := sh(t, src, "ls /home/agent"); out != "later\nnote\n" {
		t.Errorf("source after the forks wrote: %q, want only its own files", out)
	}
}
