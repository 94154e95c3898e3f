package appliance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"hearth/image"
	"hearth/vmm"
)

// What a sandbox's machine can do beyond running commands, when its tier
// can: checkpoints of its writable layer, restoring one, saving its root
// as a new image, and saying what it uses.

// Operations on a sandbox's whole machine; one runs at a time.
const (
	opCheckpoint = "checkpoint"
	opRestore    = "restore"
	opSave       = "save"
)

// beginOp marks the sandbox busy with op for as long as it runs, which
// may be seconds: it runs without s.mu, so listing and describing go on,
// and it counts as activity, so the sandbox does not pause for being idle.
// Meanwhile pause, resume, destroy and other operations are refused, and
// during a restore so are execs and file and job calls. end marks it done.
func (m *sandboxManager) beginOp(id, op string) (s *sandbox, end func(), err error) {
	if s, err = m.lockRunning(id); err != nil {
		return nil, nil, err
	}
	defer s.mu.Unlock()
	s.op = op
	s.active++
	return s, func() {
		s.mu.Lock()
		s.op = ""
		s.active--
		s.last = time.Now()
		s.mu.Unlock()
	}, nil
}

// busy refuses a call that must wait for the operation under way; the
// caller holds s.mu.
func (s *sandbox) busy() error {
	if s.op == "" {
		return nil
	}
	return conflictf("sandbox %s is busy with a %s: try again when it is done", s.rec.ID, s.op)
}

func (m *sandboxManager) unsupported(id, what string) error {
	return unsupportedf("sandbox %s runs on the %s tier, whose machines cannot %s", id, m.driverName(), what)
}

func (m *sandboxManager) checkpointer(s *sandbox) (vmm.Checkpointer, error) {
	if c, ok := s.m.(vmm.Checkpointer); ok {
		return c, nil
	}
	return nil, m.unsupported(s.rec.ID, "take checkpoints")
}

func checkCheckpointName(name string) error {
	if err := vmm.CheckName("checkpoint", name); err != nil {
		return invalid(err)
	}
	return nil
}

func errNoCheckpoint(id, name string) error {
	return notFoundf("sandbox %s has no checkpoint %s: list them with `hearth sandboxes checkpoints %s`", id, name, id)
}

// Checkpoint saves the sandbox's writable layer as name (generated when
// empty), pausing it while the layer is copied.
func (m *sandboxManager) Checkpoint(ctx context.Context, id, name string) (vmm.Checkpoint, error) {
	if name == "" {
		name = time.Now().UTC().Format("cp-20060102-150405")
	}
	if err := checkCheckpointName(name); err != nil {
		return vmm.Checkpoint{}, err
	}
	s, end, err := m.beginOp(id, opCheckpoint)
	if err != nil {
		return vmm.Checkpoint{}, err
	}
	defer end()
	c, err := m.checkpointer(s)
	if err != nil {
		return vmm.Checkpoint{}, err
	}
	start := time.Now()
	if err := c.Checkpoint(ctx, name); errors.Is(err, vmm.ErrExists) {
		return vmm.Checkpoint{}, conflictf("sandbox %s already has a checkpoint %s: pick another name, or delete it with `hearth sandboxes checkpoint-rm %s %s`",
			id, name, id, name)
	} else if err != nil {
		return vmm.Checkpoint{}, err // it names the machine, which is the sandbox
	}
	took := time.Since(start)
	cps, err := c.Checkpoints(ctx)
	if err != nil {
		return vmm.Checkpoint{}, fmt.Errorf("sandbox %s: list checkpoints: %w", id, err)
	}
	for _, cp := range cps {
		if cp.Name == name {
			m.log.Info("sandbox checkpoint taken", "id", id, "checkpoint", name, "took", took.Round(time.Microsecond), "bytes", cp.Size)
			return cp, nil
		}
	}
	return vmm.Checkpoint{}, fmt.Errorf("sandbox %s: checkpoint %s is not listed after it was taken", id, name)
}

// Checkpoints lists the sandbox's checkpoints, oldest first.
func (m *sandboxManager) Checkpoints(ctx context.Context, id string) ([]vmm.Checkpoint, error) {
	c, err := m.checkpointerOf(id)
	if err != nil {
		return nil, err
	}
	cps, err := c.Checkpoints(ctx)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: list checkpoints: %w", id, err)
	}
	return cps, nil
}

// DeleteCheckpoint removes one checkpoint.
func (m *sandboxManager) DeleteCheckpoint(ctx context.Context, id, name string) error {
	if err := checkCheckpointName(name); err != nil {
		return err
	}
	c, err := m.checkpointerOf(id)
	if err != nil {
		return err
	}
	if err := c.DeleteCheckpoint(ctx, name); errors.Is(err, vmm.ErrNotFound) {
		return errNoCheckpoint(id, name)
	} else if err != nil {
		return err
	}
	m.log.Info("sandbox checkpoint deleted", "id", id, "checkpoint", name)
	return nil
}

// checkpointerOf returns the checkpoints of a sandbox whose machine runs.
func (m *sandboxManager) checkpointerOf(id string) (vmm.Checkpointer, error) {
	s, err := m.lock(id)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if s.stopped() {
		return nil, errStopped(id)
	}
	return m.checkpointer(s)
}

// restore puts checkpoint name back: every process in the sandbox ends
// and its agent starts again. The sandbox runs afterwards, even if it was
// paused. If the agent cannot start again, the sandbox has stopped.
func (m *sandboxManager) restore(ctx context.Context, id, name string) (*sandbox, error) {
	if err := checkCheckpointName(name); err != nil {
		return nil, err
	}
	s, end, err := m.beginOp(id, opRestore)
	if err != nil {
		return nil, err
	}
	defer end()
	c, err := m.checkpointer(s)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	// Stopping halfway would leave the machine stopped: the request's
	// end does not cancel it.
	if err := c.Restore(context.WithoutCancel(ctx), name); errors.Is(err, vmm.ErrNotFound) {
		return nil, errNoCheckpoint(id, name)
	} else if err != nil {
		m.log.Warn("sandbox: restore", "id", id, "err", err)
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m.log.Info("sandbox restored; every process in it was restarted", "id", id, "checkpoint", name, "took", time.Since(start).Round(time.Millisecond))
	if s.rec.Paused != "" {
		s.rec.Paused = "" // the restarted machine runs
		return s, m.save(&s.rec)
	}
	return s, nil
}

// Save makes a new image called name from the sandbox's root as it is
// now, a child of the image the sandbox boots from, writing progress
// lines to progress.
func (m *sandboxManager) Save(ctx context.Context, id, name string, progress io.Writer) (image.Image, error) {
	if err := m.images.checkSaveName(name); err != nil {
		return image.Image{}, err
	}
	s, end, err := m.beginOp(id, opSave)
	if err != nil {
		return image.Image{}, err
	}
	defer end()
	ex, ok := s.m.(vmm.Exporter)
	if !ok {
		return image.Image{}, m.unsupported(id, "save their root as an image")
	}
	parent, err := m.images.version(s.rec.Image, s.rec.ImageHash)
	if err != nil {
		return image.Image{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	fmt.Fprintf(progress, "image %s: saving sandbox %s (image %s %s)\n", name, id, parent.Name, shortHash(parent.Hash))
	start := time.Now()
	from := "sandbox " + id
	// Save hands fill a root directory that does not exist yet, as
	// Export wants it.
	img, err := m.images.Save(ctx, name, parent, from, progress, func(rootfs string) error { return ex.Export(ctx, rootfs) })
	if err != nil {
		return image.Image{}, err
	}
	m.log.Info("sandbox saved as an image", "id", id, "image", name, "hash", shortHash(img.Hash), "took", time.Since(start).Round(time.Millisecond))
	return img, nil
}

// usage asks the machine what it uses; false when it is stopped or its
// tier cannot say. The caller holds s.mu.
func (s *sandbox) usage() (vmm.Usage, bool) {
	ur, ok := s.m.(vmm.UsageReporter)
	if !ok || s.stopped() {
		return vmm.Usage{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	u, err := ur.Usage(ctx)
	return u, err == nil
}
