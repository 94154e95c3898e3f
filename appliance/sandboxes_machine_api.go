package appliance

import (
	"net/http"

	"hearth/appliance/api"
	"hearth/vmm"
)

// The routes of what a sandbox's machine can do beyond commands:
// checkpoints, restore, save as an image.

func checkpointView(cp vmm.Checkpoint) api.Checkpoint {
	return api.Checkpoint{Name: cp.Name, Taken: cp.Taken.UTC(), Size: cp.Size}
}

func usageView(u vmm.Usage) *api.Usage {
	return &api.Usage{CpuTime: u.CPUTime.String(), Memory: u.Memory, MemoryLimit: u.MemoryLimit,
		Processes: u.Processes, Disk: u.Disk, DiskLimit: u.DiskLimit}
}

func (s *server) ListCheckpoints(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	cps, err := s.d.sbx.Checkpoints(r.Context(), id)
	out := make([]api.Checkpoint, len(cps))
	for i, cp := range cps {
		out[i] = checkpointView(cp)
	}
	result(w, http.StatusOK, out, err)
}

func (s *server) CreateCheckpoint(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.CheckpointRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	cp, err := s.d.sbx.Checkpoint(r.Context(), id, req.Name)
	result(w, http.StatusCreated, checkpointView(cp), err)
}

func (s *server) DeleteCheckpoint(w http.ResponseWriter, r *http.Request, id api.SandboxID, name api.CheckpointName) {
	result(w, http.StatusOK, api.Deleted{Deleted: name}, s.d.sbx.DeleteCheckpoint(r.Context(), id, name))
}

func (s *server) RestoreCheckpoint(w http.ResponseWriter, r *http.Request, id api.SandboxID, name api.CheckpointName) {
	sb, err := s.d.sbx.Restore(r.Context(), id, name)
	s.lifecycleReply(w, sb, err)
}

// SaveSandbox streams the save's progress lines, then the new image or an
// error naming the step that failed, as BuildImage does.
func (s *server) SaveSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.SaveSandboxRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	out := newStream(w)
	progress := &lineFrames{s: out} // its first line, once the save starts, sends the header
	img, err := s.d.sbx.Save(r.Context(), id, req.Image, progress)
	progress.flush()
	if err != nil {
		out.fail(err)
		return
	}
	v := s.d.imageView(img)
	out.frame(api.BuildFrame{Image: &v})
}
